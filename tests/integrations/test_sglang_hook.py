"""nvrtc_gather.integrations.sglang.register(): SGLang's GetKAndS.execute, called as SGLang's pool
calls it, gives the bytes of SGLang's own torch reads (issue 16, item 5). SGLang is not installed
here: tests/helpers/sglang_standin.py is a stand-in written from SGLang's source (the real
package's modules are used instead when SGLang is importable: test_real_sglang_*)."""
import importlib
import random
import sys

import pytest
import torch

from helpers import sglang_standin
from nvrtc_gather.integrations import sglang as hook


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """Import the stand-in package under the name sglang (any real one is hidden for the test)."""
    def make(kinds=("dsa",)):
        monkeypatch.syspath_prepend(sglang_standin.write(tmp_path, kinds))
        return {kind: importlib.import_module(f"sglang.srt.mem_cache.{kind}_pool") for kind in kinds}
    saved = {k: m for k, m in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for k in saved:
        del sys.modules[k]
    yield make
    hook.unregister()
    for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
        del sys.modules[k]
    sys.modules.update(saved)


def case(rng, device="cpu", index_dtype=torch.int64, num_pages=40):
    buffers = [torch.randint(0, 256, (num_pages, 64 * 132), dtype=torch.uint8, device=device) for _ in range(3)]
    batch = rng.randint(1, 7)
    lens = [rng.choice([0, 1, 63, 64, 65, rng.randint(1, 400)]) for _ in range(batch)]
    max_pages = max(1, -(-max(lens) // 64))
    order = list(range(num_pages))
    rng.shuffle(order)
    pages = torch.tensor([[order[(r * max_pages + j) % num_pages] for j in range(max_pages)] for r in range(batch)],
                         dtype=index_dtype, device=device)
    return buffers, torch.tensor(lens, dtype=index_dtype, device=device), pages, sum(lens), max(lens)


@pytest.mark.parametrize("kinds", [("dsa",), ("nsa",), ("dsa", "nsa")])
def test_register_patches_every_accessor_module_sglang_has(standin, kinds):
    standin(kinds)
    assert hook.register() == tuple(f"sglang.srt.layers.attention.{k}.index_buf_accessor" for k in ("dsa", "nsa")
                                    if k in kinds)
    assert hook.register()  # idempotent


def test_register_without_sglang_says_where_it_looked(standin, monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang", None)  # import sglang -> ImportError
    with pytest.raises(ModuleNotFoundError, match="dsa.index_buf_accessor and .*nsa.index_buf_accessor"):
        hook.register()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kind", ["dsa", "nsa"])
def test_pool_call_gives_sglangs_own_bytes(standin, seed, kind):
    pool_mod = standin((kind,))[kind]
    accessor = importlib.import_module(f"sglang.srt.layers.attention.{kind}.index_buf_accessor")
    rng = random.Random(seed)
    buffers, lens, pages, total, longest = case(rng, index_dtype=random.Random(seed).choice([torch.int32, torch.int64]))
    pool = pool_mod.DSATokenToKVPool(buffers)
    want_k, want_s = accessor.GetKAndS.torch_path(pool, buffers[1], pages, lens, total, longest)
    hook.register()
    accessor.calls.clear()
    k, s = pool.get_index_k_scale_buffer(1, lens, pages, total, longest)
    assert accessor.calls == []  # ours ran, not SGLang's
    assert k.dtype == s.dtype == torch.uint8 and k.shape == (total, 128) and s.shape == (total, 4)
    assert torch.equal(k, want_k) and torch.equal(s, want_s)


def test_other_buffers_and_old_calls_stay_with_sglang(standin):
    pool_mod = standin(("dsa",))["dsa"]
    accessor = importlib.import_module("sglang.srt.layers.attention.dsa.index_buf_accessor")
    hook.register()
    bf16 = torch.zeros(4, 64 * 128, dtype=torch.bfloat16)  # a bf16 index cache: SGLang's branch
    pool = pool_mod.DSATokenToKVPool([bf16])
    accessor.calls.clear()
    pool.get_index_k_scale_buffer(0, torch.tensor([3]), torch.tensor([[1]]), 3, 3)
    assert accessor.calls == ["sglang"]
    accessor.calls.clear()
    with pytest.raises(TypeError):  # SGLang's older single-request call (seq_len=): its own path, untouched
        accessor.GetKAndS.execute(pool, torch.zeros(4, 64 * 132, dtype=torch.uint8), seq_len=3,
                                  page_indices=torch.tensor([1]))
    assert accessor.calls == ["sglang"]


def test_unregister_gives_sglang_its_execute_back(standin):
    standin(("dsa", "nsa"))
    dsa = importlib.import_module("sglang.srt.layers.attention.dsa.index_buf_accessor")
    before = dsa.GetKAndS.__dict__["execute"]
    hook.register()
    assert dsa.GetKAndS.__dict__["execute"] is not before
    hook.unregister()
    assert dsa.GetKAndS.__dict__["execute"] is before


def test_bad_arguments_through_the_pool_are_named(standin):
    pool_mod = standin(("dsa",))["dsa"]
    hook.register()
    buf = torch.zeros(8, 64 * 132, dtype=torch.uint8)
    pool = pool_mod.DSATokenToKVPool([buf])
    with pytest.raises(ValueError, match="page_indices: page ids must fit int32"):
        pool.get_index_k_scale_buffer(0, torch.tensor([3]), torch.tensor([[2**32 + 1]]), 3, 3)
    with pytest.raises(TypeError, match="seq_len_tensor: expected a torch.Tensor, got list"):
        pool.get_index_k_scale_buffer(0, [3], torch.tensor([[1]]), 3, 3)


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(4))
def test_pool_call_on_the_gpu_gives_sglangs_own_bytes(standin, seed):
    pool_mod = standin(("dsa",))["dsa"]
    accessor = importlib.import_module("sglang.srt.layers.attention.dsa.index_buf_accessor")
    rng = random.Random(100 + seed)
    buffers, lens, pages, total, longest = case(rng, device="cuda", index_dtype=[torch.int32, torch.int64][seed % 2])
    pool = pool_mod.DSATokenToKVPool(buffers)
    want_k, want_s = accessor.GetKAndS.torch_path(pool, buffers[2], pages, lens, total, longest)
    hook.register()
    accessor.calls.clear()
    k, s = pool.get_index_k_scale_buffer(2, lens, pages, total, longest)
    assert accessor.calls == [] and k.is_cuda
    assert torch.equal(k, want_k) and torch.equal(s, want_s)


@pytest.mark.gpu
def test_gpu_page_ids_that_do_not_fit_never_read_another_page(monkeypatch):
    """No host sync by default: the request's rows are skipped (not page 1's bytes); with
    NVRTC_GATHER_DEBUG=1 the ValueError names page_indices."""
    buf = torch.randint(0, 256, (4, 64 * 132), dtype=torch.uint8, device="cuda")
    lens = torch.tensor([10, 5], device="cuda")
    pages = torch.tensor([[2**32 + 1], [3]], device="cuda")
    k, s = hook.get_index_k_scale_buffer(buf, lens, pages, 15, 10)
    page1 = buf[1, :10 * 128].view(10, 128)
    page3 = buf[3, :5 * 128].view(5, 128)
    assert torch.equal(k[10:], page3) and not torch.equal(k[:10], page1)
    lens64 = torch.tensor([2**32 + 10, 5], device="cuda")
    k, _ = hook.get_index_k_scale_buffer(buf, lens64, torch.tensor([[1], [3]], device="cuda"), 15, 10)
    assert not torch.equal(k[:10], page1)
    monkeypatch.setenv("NVRTC_GATHER_DEBUG", "1")
    with pytest.raises(ValueError, match="page_indices: page ids must fit int32"):
        hook.get_index_k_scale_buffer(buf, lens, pages, 15, 10)
    with pytest.raises(ValueError, match="seq_len_tensor: lengths must be >= 0"):
        hook.get_index_k_scale_buffer(buf, lens64, torch.tensor([[1], [3]], device="cuda"), 15, 10)


def _real_sglang():
    for name in hook.MODULES:
        try:
            return importlib.import_module(name)
        except Exception:
            continue
    pytest.skip("SGLang is not installed here (the stand-in tests above cover the hook)")


@pytest.mark.gpu
def test_real_sglang_getkands_matches_its_triton_path():
    """Where SGLang itself is installed (a GPU image with it): its GetKAndS.triton against the
    hooked execute, called as its pool calls it."""
    accessor = _real_sglang()

    class Pool:
        page_size, index_head_dim, quant_block_size, device = 64, 128, 128, torch.device("cuda")

    rng = random.Random(7)
    buffers, lens, pages, total, longest = case(rng, device="cuda")
    want = accessor.GetKAndS.triton(Pool(), buffers[0], pages, lens, total, longest)
    hook.register()
    try:
        got = accessor.GetKAndS.execute(Pool(), buffers[0], page_indices=pages, seq_len_tensor=lens,
                                        seq_len_sum=total, max_seq_len=longest)
    finally:
        hook.unregister()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
