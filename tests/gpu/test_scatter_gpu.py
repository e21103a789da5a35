"""indexer_k_scatter's NVRTC kernels on a real GPU: bit-exact against the independent per-token
reference (tests/helpers/scatter_cases.py) on random bytes (every unwritten or stray byte of the
store shows), in each vector width; a large call past the grid cap (the grid-stride loop)
against the torch path; slots past the cache skipped (and reported in debug mode); CUDA-graph
capture and replay."""
import random
import re

import pytest
import torch

import nvrtc_gather as ng
from nvrtc_gather.kernels import indexer_k_scatter as spec
from nvrtc_gather.ops import indexer_k_scatter as op
from nvrtc_gather.ops.indexer_k_scatter_torch import scatter_torch
from helpers.scatter_cases import FP8, make_scatter_case, scatter_reference

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("k_off,kv_off,hd,vec", [(0, 0, 128, 16), (8, 0, 128, 8), (4, 0, 128, 4), (0, 0, 12, 4)])
@pytest.mark.parametrize("seed", range(6))
def test_gpu_kernel_matches_the_reference(k_off, kv_off, hd, vec, seed):
    c = make_scatter_case(random.Random(1000 * seed + vec), device="cuda", head_dim=hd, k_offset=k_off,
                          kv_offset=kv_off, slot_dtype=(torch.int64, torch.int32)[seed % 2])  # vLLM's, SGLang's
    want = scatter_reference(c).cpu()  # the reference reads the inputs, writes a copy of the store
    if c.slot_mapping.numel():
        plan = op.plan_scatter(*c.args())
        assert int(re.search(r"_v(\d+)", op.launch_config(plan).entry).group(1)) <= vec, c.desc
    ng.indexer_k_scatter(*c.args())
    ng.indexer_k_scatter(*c.args())  # the remembered layout (fast path) writes the same
    torch.cuda.synchronize()
    assert torch.equal(c.store.cpu(), want), c.desc


@pytest.mark.parametrize("k_off,kv_off,vec", [(0, 0, 16), (8, 0, 8), (0, 4, 4)])
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_gpu_fixed_layout_entries_match_the_reference(k_off, kv_off, vec, slot_dtype):
    """SGLang's default layout (spec.FIXED_LAYOUT) launches the entries built with its sizes as
    constants, in every width and slot dtype: bit-exact, first call and remembered layout."""
    bs, hd, nq = spec.FIXED_LAYOUT
    for seed in range(3):
        rng = random.Random(seed * 100 + vec)
        c = make_scatter_case(rng, device="cuda", head_dim=hd, nq=nq, block_size=bs, num_blocks=6,
                              num_tokens=rng.randint(1, 300), k_offset=k_off, kv_offset=kv_off, slot_dtype=slot_dtype)
        want = scatter_reference(c).cpu()
        entry = op.launch_config(op.plan_scatter(*c.args())).entry
        assert spec.FIXED_TAG in entry and int(re.search(r"_v(\d+)", entry).group(1)) == vec, (entry, c.desc)
        ng.indexer_k_scatter(*c.args())
        ng.indexer_k_scatter(*c.args())
        torch.cuda.synchronize()
        assert torch.equal(c.store.cpu(), want), c.desc


def test_sglang_shapes_many_tokens_past_the_grid_cap():
    """2M tokens of SGLang's shapes (fp8 [T, 128], fp32 [T]): more units than MAX_BLOCKS * THREADS."""
    T, bs = 2_000_000, 64
    nb = -(-T // bs) + 3
    assert T * (128 // 16 + 1) > spec.MAX_BLOCKS * spec.THREADS
    g = torch.Generator(device="cuda").manual_seed(5)
    kv = torch.randint(0, 256, (nb, bs, 132), dtype=torch.uint8, device="cuda", generator=g)
    k = torch.randint(0, 256, (T, 128), dtype=torch.uint8, device="cuda", generator=g).view(FP8)
    scale = torch.rand(T, device="cuda", generator=g)
    slots = torch.randperm(nb * bs, device="cuda", generator=g)[:T]
    slots[::97] = -1
    want = kv.clone()
    scatter_torch(op.plan_scatter(k, scale, want, slots), k, scale, want, slots)
    ng.indexer_k_scatter(k, scale, kv, slots)
    torch.cuda.synchronize()
    assert torch.equal(kv, want)


@pytest.mark.slow
def test_units_past_int32_take_the_64_bit_split():
    """68M tokens at vector width 4 (k 4 bytes off its allocation): 32 value units a token, so
    units past 2**31, where the kernel splits a unit into (token, column) by 64-bit division
    instead of a shift of 32-bit values. Slots reversed, every 1000th padding; each token's
    values and scale checked where its slot puts them (~20 GB of GPU memory)."""
    T, bs = 68_000_000, 64
    assert T * (128 // 4) > 2**31
    if torch.cuda.mem_get_info()[0] < 24 << 30:
        pytest.skip("needs ~20 GB of free GPU memory")
    nb = -(-T // bs)
    kv = torch.zeros(nb, bs * 132, dtype=torch.uint8, device="cuda")
    raw = torch.empty(T * 128 + 4, dtype=torch.uint8, device="cuda")
    k = raw[4:].view(T, 128)
    k.random_(0, 256)
    scale = torch.arange(T, device="cuda", dtype=torch.float32).add_(1.0)
    slots = torch.arange(T - 1, -1, -1, device="cuda", dtype=torch.int64)
    slots[::1000] = -1
    assert op.launch_config(op.plan_scatter(k.view(FP8), scale, kv.view(nb, bs, 132), slots)).entry.startswith(
        spec.entry_name(4))
    ng.indexer_k_scatter(k.view(FP8), scale, kv.view(nb, bs, 132), slots)
    torch.cuda.synchronize()
    values = kv[:, :bs * 128].view(nb, bs, 128)  # views: each check gathers only its own rows
    scales = kv[:, bs * 128:].view(nb, bs, 4)
    for t0 in range(0, T, 8_000_000):
        t = torch.arange(t0, min(T, t0 + 8_000_000), device="cuda")
        sl = slots[t]
        kept = sl >= 0
        at = sl[kept]
        assert torch.equal(values[at // bs, at % bs], k[t[kept]]), t0
        assert torch.equal(scales[at // bs, at % bs].view(torch.float32).view(-1), scale[t[kept]]), t0
        pad = T - 1 - t[~kept]  # the padding tokens' slots: untouched zeros
        assert not values[pad // bs, pad % bs].any() and not scales[pad // bs, pad % bs].any(), t0


def test_slots_past_the_cache_are_skipped_and_reported_in_debug_mode(monkeypatch):
    c = make_scatter_case(random.Random(9), device="cuda", head_dim=128, nq=1, block_size=64, num_blocks=3,
                          num_tokens=8, padding=0)
    good = c.slot_mapping.clone()
    good[2] = good[5] = -1
    want = scatter_reference(type(c)(c.store, c.kv_cache, c.k, c.k_scale, good, c.block_stride, c.desc)).cpu()
    c.slot_mapping[2], c.slot_mapping[5] = 192, 2**40
    ng.indexer_k_scatter(*c.args())
    torch.cuda.synchronize()
    assert torch.equal(c.store.cpu(), want)
    monkeypatch.setenv("NVRTC_GATHER_DEBUG", "1")
    with pytest.raises(ValueError, match="slot_mapping: entry [25] = .* is past the cache's last slot"):
        ng.indexer_k_scatter(*c.args())


def test_cuda_graph_replay_writes_the_new_contents():
    g = torch.Generator(device="cuda").manual_seed(3)
    kv = torch.randint(0, 256, (4, 64, 132), dtype=torch.uint8, device="cuda", generator=g)
    k = torch.randint(0, 256, (50, 128), dtype=torch.uint8, device="cuda", generator=g).view(FP8)
    s = torch.rand(50, device="cuda", generator=g)
    sm = torch.randperm(256, device="cuda", generator=g)[:50]
    ng.indexer_k_scatter(k, s, kv, sm)  # loaded before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ng.indexer_k_scatter(k, s, kv, sm)
    for _ in range(3):
        k.view(torch.uint8).copy_(torch.randint(0, 256, (50, 128), dtype=torch.uint8, device="cuda", generator=g))
        s.copy_(torch.rand(50, device="cuda", generator=g))
        sm.copy_(torch.randperm(256, device="cuda", generator=g)[:50])
        sm[::7] = -1
        want = kv.cpu()
        scatter_torch(op.plan_scatter(k.cpu(), s.cpu(), want, sm.cpu()), k.cpu(), s.cpu(), want, sm.cpu())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(kv.cpu(), want)
