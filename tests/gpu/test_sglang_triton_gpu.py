"""Our gather and scatter against SGLang's own Triton kernels (the real package, 0.5.23 on the
H200: carried as a wheel, see README "SGLang"), on the same pages, bit-exact: SGLang's
``GetKAndS.triton`` / ``SetKAndS.triton`` (its ``_get_k_and_s_triton`` / ``_set_k_and_s_triton``)
beside the hooked ``execute`` and the adapter's functions. Skipped when SGLang is not importable,
unless NVRTC_GATHER_REQUIRE_SGLANG=1, where that fails."""
import importlib
import os
import random
from types import SimpleNamespace

import pytest
import torch

from helpers.launches import kernels_launched
from nvrtc_gather.integrations import sglang as hook

pytestmark = pytest.mark.gpu
FP8 = torch.float8_e4m3fn


@pytest.fixture(scope="module")
def accessor():
    for name in hook.MODULES:
        try:
            return importlib.import_module(name)
        except ImportError as e:
            if getattr(e, "name", None) and name.startswith(e.name):
                continue
            if os.environ.get("NVRTC_GATHER_REQUIRE_SGLANG") in ("1", "accessor"):
                raise
            pytest.skip(f"SGLang's accessor {name} does not import here: {e}")
    msg = "SGLang is not installed here (the H200 run installs the wheel from .whl/)"
    if os.environ.get("NVRTC_GATHER_REQUIRE_SGLANG") in ("1", "accessor"):
        pytest.fail(msg)
    pytest.skip(msg)


def pool(accessor, page_size=64):
    p = SimpleNamespace(page_size=page_size, index_head_dim=128, quant_block_size=128, device=torch.device("cuda"))
    p.index_page_size = page_size
    return p


def read_case(rng, num_pages=300, page_size=64, index_dtype=torch.int64):
    buf = torch.randint(0, 256, (num_pages, page_size * 132), dtype=torch.uint8, device="cuda")
    batch = rng.choice([1, 3, 17, 64])
    lens = [rng.choice([0, 1, 63, 64, 65, 300, rng.randint(1, 2000)]) for _ in range(batch)]
    max_pages = max(1, -(-max(lens) // page_size))
    order = list(range(num_pages))
    rng.shuffle(order)
    pages = torch.tensor([[order[(r * max_pages + j) % num_pages] for j in range(max_pages)] for r in range(batch)],
                         dtype=index_dtype, device="cuda")
    return buf, torch.tensor(lens, dtype=index_dtype, device="cuda"), pages, sum(lens), max(lens)


@pytest.mark.parametrize("seed", range(8))
def test_our_gather_equals_sglangs_triton_gather(accessor, seed):
    rng = random.Random(seed)
    buf, lens, pages, total, longest = read_case(rng, index_dtype=[torch.int32, torch.int64][seed % 2])
    p = pool(accessor)
    want_k, want_s = accessor.GetKAndS.triton(p, buf, pages, lens, total, longest)
    got_k, got_s = hook.get_index_k_scale_buffer(buf, lens, pages, total, longest)
    hook.register()
    try:
        hk, hs = accessor.GetKAndS.execute(p, buf, page_indices=pages, seq_len_tensor=lens, seq_len_sum=total,
                                           max_seq_len=longest)
        assert hook.status()["left_to_sglang"] == {}
    finally:
        hook.unregister()
    torch.cuda.synchronize()
    for k, s in ((got_k, got_s), (hk, hs)):
        assert torch.equal(k, want_k) and torch.equal(s, want_s)


@pytest.mark.parametrize("seed", range(8))
def test_our_scatter_equals_sglangs_triton_scatter(accessor, seed):
    rng = random.Random(100 + seed)
    num_pages = 200
    g = torch.Generator(device="cuda").manual_seed(seed)
    buf = torch.randint(0, 256, (num_pages, 64 * 132), dtype=torch.uint8, device="cuda", generator=g)
    n = rng.choice([1, 7, 1000, 12000])
    loc = torch.randperm(num_pages * 64, device="cuda", generator=g)[:n]
    if seed % 2:
        loc = loc.to(torch.int32)
    k = torch.randint(0, 256, (n, 128), dtype=torch.uint8, device="cuda", generator=g).view(FP8)
    scale = torch.rand(n, 1, device="cuda", generator=g) if seed % 3 == 0 else torch.rand(n, device="cuda", generator=g)
    theirs, ours, hooked = buf.clone(), buf.clone(), buf.clone()
    p = pool(accessor)
    accessor.SetKAndS.triton(p, theirs, loc, k, scale)
    hook.set_index_k_scale_buffer(ours, loc, k, scale)
    hook.register()
    try:
        accessor.SetKAndS.execute(pool=p, buf=hooked, loc=loc, index_k=k, index_k_scale=scale)
        assert hook.status()["left_to_sglang"] == {}
    finally:
        hook.unregister()
    torch.cuda.synchronize()
    assert not torch.equal(theirs, buf)  # the call wrote something
    assert torch.equal(ours, theirs) and torch.equal(hooked, theirs)


def test_the_hooked_calls_launch_what_the_entries_do_without_a_sync(accessor):
    """SGLang's own calls of the hooked GetKAndS / SetKAndS: one kernel each, the entries' own, no
    host sync (torch's sync debug mode raises), nothing left to SGLang."""
    buf, lens, pages, total, longest = read_case(random.Random(5))
    assert total > 0
    n = 700
    loc = torch.randperm(buf.size(0) * 64, device="cuda")[:n]
    k = torch.randint(0, 256, (n, 128), dtype=torch.uint8, device="cuda").view(FP8)
    scale = torch.rand(n, device="cuda")
    p = pool(accessor)
    plain = kernels_launched([lambda: hook.get_index_k_scale_buffer(buf, lens, pages, total, longest),
                              lambda: hook.set_index_k_scale_buffer(buf, loc, k, scale)])
    hook.register()
    try:
        hooked = kernels_launched([
            lambda: accessor.GetKAndS.execute(p, buf, page_indices=pages, seq_len_tensor=lens, seq_len_sum=total,
                                              max_seq_len=longest),
            lambda: accessor.SetKAndS.execute(pool=p, buf=buf, loc=loc, index_k=k, index_k_scale=scale)])
        assert hook.status()["left_to_sglang"] == {}
    finally:
        hook.unregister()
    assert len(plain) == 2 and hooked == plain, (plain, hooked)


def test_write_then_read_round_trip_through_both(accessor):
    """SGLang writes with its Triton scatter, we read; we write, SGLang's Triton gather reads."""
    g = torch.Generator(device="cuda").manual_seed(11)
    buf = torch.zeros(64, 64 * 132, dtype=torch.uint8, device="cuda")
    n = 64 * 40
    loc = torch.randperm(64 * 64, device="cuda", generator=g)[:n]
    k = torch.randint(0, 256, (n, 128), dtype=torch.uint8, device="cuda", generator=g).view(FP8)
    scale = torch.rand(n, device="cuda", generator=g)
    p = pool(accessor)
    a, b = buf.clone(), buf.clone()
    accessor.SetKAndS.triton(p, a, loc, k, scale)
    hook.set_index_k_scale_buffer(b, loc, k, scale)
    pages = torch.arange(64, device="cuda", dtype=torch.int32).view(1, 64)
    lens = torch.tensor([64 * 64], device="cuda", dtype=torch.int32)
    theirs = accessor.GetKAndS.triton(p, b, pages, lens, 64 * 64, 64 * 64)
    ours = hook.get_index_k_scale_buffer(a, lens, pages, 64 * 64, 64 * 64)
    torch.cuda.synchronize()
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
