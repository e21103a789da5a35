"""torch.compile refuses an output that overlaps an input on every backend (issue 16, item 7).

Under ``backend="aot_eager"`` the compiled graph hands the op copies of its outputs, so the
eager pointer check cannot see a ``dst_k`` that is a view of ``kv_cache``; the copy-back then
overwrites the cache. The fake implementations must refuse it at trace time, nothing written."""
import pytest
import torch

import nvrtc_gather as ng

BACKENDS = ["eager", "aot_eager", "inductor"]


def _raises_overlap(fn, *args, match):
    with pytest.raises(Exception) as info:  # dynamo wraps the fake's ValueError in its TorchRuntimeError
        fn(*args)
    assert isinstance(info.value, ValueError) or type(info.value).__name__ == "TorchRuntimeError", info.value
    assert match in str(info.value), str(info.value)[:2000]


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_output_viewing_the_cache_is_refused_and_nothing_is_written(backend):
    torch._dynamo.reset()
    kv = torch.randint(0, 256, (4, 64, 132), dtype=torch.uint8)
    before = kv.clone()
    bt = torch.tensor([[0, 1]], dtype=torch.int32)
    cu = torch.tensor([0, 100], dtype=torch.int32)

    def step(kv, bt, cu):
        dst_k = kv.view(-1)[64 * 132 * 2: 64 * 132 * 2 + 100 * 128].view(100, 128)  # inside block 2
        dst_s = torch.empty(100, 4, dtype=torch.uint8)
        ng.cp_gather_indexer_k_quant_cache(kv, dst_k, dst_s, bt, cu)
        return dst_s

    _raises_overlap(torch.compile(step, fullgraph=True, backend=backend), kv, bt, cu,
                    match="dst_k: its memory overlaps kv_cache")
    assert torch.equal(kv, before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_scale_output_viewing_the_block_table_is_refused(backend):
    torch._dynamo.reset()
    kv = torch.randint(0, 256, (4, 64, 132), dtype=torch.uint8)
    table = torch.zeros(12, 8, dtype=torch.int32)
    before = table.clone()
    cu = torch.tensor([0, 10], dtype=torch.int32)

    def step(kv, table, cu):
        dst_s = table.view(torch.uint8)[0:10, 0:4]  # 10 rows of 4 bytes, 32 apart: across row 1 of table
        ng.cp_gather_indexer_k_quant_cache(kv, torch.empty(10, 128, dtype=torch.uint8), dst_s, table[1:2], cu)
        return dst_s

    _raises_overlap(torch.compile(step, fullgraph=True, backend=backend), kv, table, cu,
                    match="dst_scale: its memory overlaps block_table")
    assert torch.equal(table, before)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_disjoint_views_of_one_buffer_still_compile(backend):
    """Outputs and inputs carved from one workspace without overlap are accepted (and correct)."""
    torch._dynamo.reset()
    work = torch.randint(0, 256, (4 * 64 * 132 + 100 * 128 + 100 * 4,), dtype=torch.uint8)
    kv_bytes = 4 * 64 * 132
    bt = torch.tensor([[3, 1]], dtype=torch.int32)
    cu = torch.tensor([0, 100], dtype=torch.int32)

    def step(work, bt, cu):
        kv = work[:kv_bytes].view(4, 64, 132)
        dst_k = work[kv_bytes: kv_bytes + 100 * 128].view(100, 128)
        dst_s = work[kv_bytes + 100 * 128:].view(100, 4)
        ng.cp_gather_indexer_k_quant_cache(kv, dst_k, dst_s, bt, cu)
        return dst_k.to(torch.int64).sum()

    expect = work.clone()
    ng.cp_gather_indexer_k_quant_cache(expect[:kv_bytes].view(4, 64, 132), expect[kv_bytes: kv_bytes + 12800].view(100, 128),
                                       expect[kv_bytes + 12800:].view(100, 4), bt, cu)
    torch.compile(step, fullgraph=True, backend=backend)(work, bt, cu)
    assert torch.equal(work, expect)


@pytest.mark.parametrize("backend", BACKENDS)
def test_write_op_cache_viewing_k_is_refused_and_nothing_is_written(backend):
    torch._dynamo.reset()
    k = torch.randn(40, 128, generator=torch.Generator().manual_seed(4))  # 20480 bytes of fp32
    before = k.clone()
    slots = torch.arange(8, dtype=torch.int64)

    def step(k, slots):
        kv = k.view(torch.uint8).view(-1)[: 2 * 16 * 132].view(2, 16, 132)  # the cache inside k's first rows
        ng.indexer_k_quant_and_cache(k, kv, slots, 128, "ue8m0")
        return kv

    _raises_overlap(torch.compile(step, fullgraph=True, backend=backend), k, slots,
                    match="kv_cache: its memory overlaps k")
    assert torch.equal(k, before)


def test_an_overlap_at_a_symbolic_offset_is_the_named_value_error():
    """Issue #36 item 4: under dynamic=True the overlap's offsets are SymInts; formatting the
    message raised TypeError (no hex format) instead of the ValueError naming both."""
    def step(buf, bt, cu):
        dst = buf[buf.shape[0] - 40:].view(5, 8)  # an offset that depends on a dynamic size
        ng.cp_gather_cache(buf[:64].view(2, 4, 8), dst, bt, cu, 1)
        return dst.sum()

    torch._dynamo.reset()
    fn = torch.compile(step, fullgraph=True, dynamic=True, backend="eager")
    with pytest.raises(Exception) as info:
        fn(torch.zeros(90), torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([0, 5], dtype=torch.int32))
    assert "dst: its memory overlaps src_cache" in str(info.value), str(info.value)[:2000]


def _two_storages(nbytes: int):
    """Two torch tensors over the same bytes with different storages (torch.from_numpy twice)."""
    import numpy as np

    raw = np.random.default_rng(3).integers(0, 256, nbytes, dtype=np.uint8)
    return raw, torch.from_numpy(raw), torch.from_numpy(raw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cp_gather_cache_dst_overlapping_the_cache_through_a_second_storage_is_refused(backend):
    """Issue 36 item 4: a fake tensor sees two storages; the guard put in the graph checks the
    real tensors' addresses before the op gets its copy of dst."""
    torch._dynamo.reset()
    raw, a, b = _two_storages(4 * 16 * 8)
    before = raw.copy()
    bt = torch.tensor([[0, 1]], dtype=torch.int32)
    cu = torch.tensor([0, 20], dtype=torch.int32)

    def step(src, dst, bt, cu):
        ng.cp_gather_cache(src, dst, bt, cu, 1)
        return dst.sum()

    _raises_overlap(torch.compile(step, fullgraph=True, backend=backend), a.view(4, 16, 8), b[200:360].view(20, 8),
                    bt, cu, match="dst: its memory overlaps src_cache")
    assert (raw == before).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_indexer_k_scatter_cache_overlapping_k_through_a_second_storage_is_refused(backend):
    """Issue 37 item 1: the same for the write ops (every op with WRITES/READS lists)."""
    torch._dynamo.reset()
    raw, a, b = _two_storages(2 * 16 * 132 + 8 * 128)
    before = raw.copy()
    k = a[:8 * 128].view(torch.float8_e4m3fn).view(8, 128)
    kv = b[4 * 128: 4 * 128 + 2 * 16 * 132].view(2, 16, 132)  # over k's last four rows
    scale = torch.ones(8, 1)
    slots = torch.arange(8, dtype=torch.int64)

    def step(k, scale, kv, slots):
        ng.indexer_k_scatter(k, scale, kv, slots)
        return kv.sum()

    _raises_overlap(torch.compile(step, fullgraph=True, backend=backend), k, scale, kv, slots,
                    match="kv_cache: its memory overlaps k")
    assert (raw == before).all()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_each_op_traced_by_its_plain_function_gets_its_guard_in_the_graph(backend):
    """Every registered op with a fake check has a guard, and the plain function's graph calls it."""
    from nvrtc_gather.ops import library

    assert set(library._GUARDS) >= {"cp_gather_cache", "gather_and_maybe_dequant_cache", "dsv4_gather_flat",
                                    "dequantize_and_gather_k_cache", "cp_gather_indexer_k_quant_cache",
                                    "indexer_k_quant_and_cache", "indexer_k_scatter",
                                    "cp_gather_and_upconvert_fp8_kv_cache", "concat_and_cache_mla"}
    torch._dynamo.reset()
    seen = []

    def spy(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return torch._dynamo.backends.registry.lookup_backend(backend)(gm, example_inputs)

    def step(src, dst, bt, cu):
        ng.cp_gather_cache(src, dst, bt, cu, 1)
        return dst.sum()

    src = torch.randint(0, 256, (2, 16, 8), dtype=torch.uint8)
    dst = torch.zeros(20, 8, dtype=torch.uint8)
    torch.compile(step, fullgraph=True, backend=spy)(src, dst, torch.tensor([[1, 0]], dtype=torch.int32),
                                                     torch.tensor([0, 20], dtype=torch.int32))
    assert any("cp_gather_cache_no_overlap" in t for t in seen) and any(t.endswith("cp_gather_cache") or
                                                                         "cp_gather_cache.default" in t for t in seen), seen
    assert torch.equal(dst, torch.cat([src[1], src[0, :4]]))
