"""nvrtc_gather.integrations.sglang.register(): SGLang's GetKAndS.execute and SetKAndS.execute,
called as SGLang's pool calls them, give the bytes of SGLang's own torch reads and writes, in the
accessor module of every release (0.5.10-0.5.23); what the hook does not serve stays with SGLang
and status() says so; register()'s failures name their cause. SGLang is not installed here:
tests/helpers/sglang_standin.py is a stand-in written from SGLang's source (the CI matrix,
scripts/engine_matrix.sh, runs tests/integrations/test_sglang_real.py against the real
releases)."""
import random
import sys

import pytest
import torch

from nvrtc_gather.integrations import sglang as hook

NEWEST, *_ = hook.MODULES
FP8 = torch.float8_e4m3fn


def case(rng, device="cpu", index_dtype=torch.int64, num_pages=40, page_size=64):
    buffers = [torch.randint(0, 256, (num_pages, page_size * 132), dtype=torch.uint8, device=device) for _ in range(3)]
    batch = rng.randint(1, 7)
    lens = [rng.choice([0, 1, page_size - 1, page_size, page_size + 1, rng.randint(1, 400)]) for _ in range(batch)]
    max_pages = max(1, -(-max(lens) // page_size))
    order = list(range(num_pages))
    rng.shuffle(order)
    pages = torch.tensor([[order[(r * max_pages + j) % num_pages] for j in range(max_pages)] for r in range(batch)],
                         dtype=index_dtype, device=device)
    return buffers, torch.tensor(lens, dtype=index_dtype, device=device), pages, sum(lens), max(lens)


def write_case(rng, num_pages, page_size, device="cpu", scale_2d=False, loc_dtype=torch.int64):
    n = rng.randint(1, min(90, num_pages * page_size))
    loc = torch.tensor(rng.sample(range(num_pages * page_size), n), dtype=loc_dtype, device=device)
    k = torch.randint(0, 256, (n, 128), dtype=torch.uint8, device=device).view(FP8)
    s = torch.rand(n, 1 if scale_2d else None, device=device) if scale_2d else torch.rand(n, device=device)
    return loc, k, s


@pytest.mark.parametrize("i", range(len(hook.ACCESSORS)))
def test_register_hooks_the_newest_accessor_of_each_release(standin, i):
    """Each release's layout (its module and the older re-export paths it keeps): the newest is
    hooked, both classes."""
    standin(hook.MODULES[i:])
    name = hook.MODULES[i]
    assert hook.register() == (name,)
    assert hook.register() == (name,)  # idempotent
    module = sys.modules[name]
    assert hook._TAG in module.GetKAndS.__dict__ and hook._TAG in module.SetKAndS.__dict__
    st = hook.status()
    assert st["sglang"] == "0.5.99" and st["module"] == name
    assert st["hooked"] == {"GetKAndS.execute": name, "SetKAndS.execute": name}


class _NoSGLang:
    """A meta-path finder for which no sglang exists (also where a real one is installed)."""

    def find_spec(self, name, path=None, target=None):
        if name == "sglang" or name.startswith("sglang."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def test_register_without_sglang_says_so(standin, monkeypatch):
    monkeypatch.setattr(sys, "meta_path", [_NoSGLang()] + sys.meta_path)
    with pytest.raises(ImportError, match="SGLang is not installed here .*dsa_index_k_cache.*nsa.index_buf_accessor"):
        hook.register()


def test_a_release_that_moved_the_accessor_again_fails_naming_release_and_paths(standin):
    standin(("sglang.kernels.ops.kvcache.somewhere_new",), version="0.6.1")
    with pytest.raises(ImportError) as e:
        hook.register()
    msg = str(e.value)
    assert "SGLang 0.6.1 has none of the index-K accessor modules" in msg
    for name, introduced in hook.ACCESSORS:
        assert f"{name} (since {introduced})" in msg


def test_a_missing_dependency_is_named_not_hidden(standin):
    standin((NEWEST,), broken="nosuchdep_for_the_test")
    with pytest.raises(ImportError, match=f"SGLang 0.5.99 has {NEWEST}, but importing it failed: "
                                          "No module named 'nosuchdep_for_the_test'") as e:
        hook.register()
    assert isinstance(e.value.__cause__, ModuleNotFoundError)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("i", range(len(hook.ACCESSORS)))
def test_pool_read_gives_sglangs_own_bytes(standin, seed, i):
    pool_mod = standin((hook.MODULES[i],))
    accessor = sys.modules[hook.MODULES[i]]
    rng = random.Random(seed)
    buffers, lens, pages, total, longest = case(rng, index_dtype=rng.choice([torch.int32, torch.int64]))
    pool = pool_mod.DSATokenToKVPool(buffers)
    want_k, want_s = accessor.GetKAndS.torch_path(pool, buffers[1], pages, lens, total, longest)
    hook.register()
    accessor.calls.clear()
    k, s = pool.get_index_k_scale_buffer(1, lens, pages, total, longest)
    assert accessor.calls == []  # ours ran, not SGLang's
    assert k.dtype == s.dtype == torch.uint8 and k.shape == (total, 128) and s.shape == (total, 4)
    assert torch.equal(k, want_k) and torch.equal(s, want_s)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("i", range(len(hook.ACCESSORS)))
def test_pool_write_gives_sglangs_own_bytes(standin, seed, i):
    pool_mod = standin((hook.MODULES[i],))
    accessor = sys.modules[hook.MODULES[i]]
    rng = random.Random(seed)
    buffers = [torch.randint(0, 256, (12, 64 * 132), dtype=torch.uint8) for _ in range(2)]
    loc, k, s = write_case(rng, 12, 64, scale_2d=seed % 2 == 1, loc_dtype=[torch.int64, torch.int32][seed % 3 == 2])
    want = buffers[1].clone()
    accessor.SetKAndS.torch_path(pool_mod.DSATokenToKVPool([want]), want, loc, k, s)
    pool = pool_mod.DSATokenToKVPool(buffers)
    hook.register()
    accessor.calls.clear()
    pool.set_index_k_scale_buffer(1, loc, k, s)
    assert accessor.calls == []
    assert torch.equal(buffers[1], want)


def test_index_page_size_is_the_page_size_where_the_pool_has_it(standin):
    """SGLang 0.5.23: the index buffer's pages hold index_page_size tokens (page_size //
    index_kpool), and its accessor reads pool.index_page_size."""
    pool_mod = standin((NEWEST,), page_attr="index_page_size")
    accessor = sys.modules[NEWEST]
    rng = random.Random(3)
    buffers, lens, pages, total, longest = case(rng, page_size=32)
    pool = pool_mod.DSATokenToKVPool(buffers, page_size=128, index_page_size=32)
    want = accessor.GetKAndS.torch_path(pool, buffers[0], pages, lens, total, longest)
    loc, k, s = write_case(rng, 40, 32)
    want_buf = buffers[2].clone()
    accessor.SetKAndS.torch_path(pool, want_buf, loc, k, s)
    hook.register()
    accessor.calls.clear()
    got = pool.get_index_k_scale_buffer(0, lens, pages, total, longest)
    pool.set_index_k_scale_buffer(2, loc, k, s)
    assert accessor.calls == [] and hook.status()["left_to_sglang"] == {}
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and torch.equal(buffers[2], want_buf)


def test_what_we_do_not_serve_stays_with_sglang_and_status_says_why(standin):
    pool_mod = standin((NEWEST,))
    accessor = sys.modules[NEWEST]
    hook.register()
    bf16 = torch.zeros(4, 64 * 128, dtype=torch.bfloat16)  # a bf16 index cache: SGLang's branch
    odd = torch.zeros(4, 64 * 140, dtype=torch.uint8)      # a page layout we do not know
    pool = pool_mod.DSATokenToKVPool([bf16, odd])
    accessor.calls.clear()
    for layer in (0, 1):  # what the stand-in's torch path makes of these does not matter: who ran does
        try:
            pool.get_index_k_scale_buffer(layer, torch.tensor([3]), torch.tensor([[1]]), 3, 3)
        except RuntimeError:
            pass
    pool.set_index_k_scale_buffer(1, torch.tensor([1]), torch.zeros(1, 128, dtype=FP8), torch.ones(1))
    with pytest.raises(TypeError):  # SGLang's older single-request call (seq_len=): its own path, untouched
        accessor.GetKAndS.execute(pool, torch.zeros(4, 64 * 132, dtype=torch.uint8), seq_len=3,
                                  page_indices=torch.tensor([1]))
    assert accessor.calls == ["sglang"] * 4
    left = hook.status()["left_to_sglang"]
    assert set(left["GetKAndS.execute"]) == {"index cache dtype", "page layout", "call"}
    assert set(left["SetKAndS.execute"]) == {"page layout"}
    assert "torch.bfloat16" in left["GetKAndS.execute"]["index cache dtype"]


def test_aiter_preshuffle_leaves_everything_to_sglang(standin):
    standin((NEWEST,), preshuffle=True)
    accessor = sys.modules[NEWEST]
    before = accessor.GetKAndS.__dict__["execute"], accessor.SetKAndS.__dict__["execute"]
    assert hook.register() == ()
    assert (accessor.GetKAndS.__dict__["execute"], accessor.SetKAndS.__dict__["execute"]) == before
    st = hook.status()
    assert st["hooked"] == {} and set(st["left_to_sglang"]) == {"GetKAndS.execute", "SetKAndS.execute"}
    assert "aiter preshuffle" in st["left_to_sglang"]["GetKAndS.execute"]


def test_the_log_says_once_what_was_left(standin, caplog):
    pool_mod = standin((NEWEST,))
    hook.register()
    pool = pool_mod.DSATokenToKVPool([torch.zeros(4, 64 * 140, dtype=torch.uint8)])
    with caplog.at_level("INFO", logger="nvrtc_gather.integrations.sglang"):
        for _ in range(3):
            pool.set_index_k_scale_buffer(0, torch.tensor([1]), torch.zeros(1, 128, dtype=FP8), torch.ones(1))
    lines = [r.getMessage() for r in caplog.records if "keeps its own path" in r.getMessage()]
    assert len(lines) == 1 and "SetKAndS.execute keeps its own path for page layout" in lines[0]


def test_unregister_gives_sglang_its_execute_back(standin):
    standin((NEWEST,))
    module = sys.modules[NEWEST]
    before = module.GetKAndS.__dict__["execute"], module.SetKAndS.__dict__["execute"]
    hook.register()
    assert module.GetKAndS.__dict__["execute"] is not before[0]
    hook.unregister()
    assert (module.GetKAndS.__dict__["execute"], module.SetKAndS.__dict__["execute"]) == before
    assert hook.status()["hooked"] == {}


def test_bad_arguments_through_the_pool_are_named(standin):
    pool_mod = standin((NEWEST,))
    hook.register()
    buf = torch.zeros(8, 64 * 132, dtype=torch.uint8)
    pool = pool_mod.DSATokenToKVPool([buf])
    with pytest.raises(ValueError, match="page_indices: page ids must fit int32"):
        pool.get_index_k_scale_buffer(0, torch.tensor([3]), torch.tensor([[2**32 + 1]]), 3, 3)
    with pytest.raises(TypeError, match="seq_len_tensor: expected a torch.Tensor, got list"):
        pool.get_index_k_scale_buffer(0, [3], torch.tensor([[1]]), 3, 3)
    with pytest.raises(ValueError, match="loc: entry 0 = 512 is past the cache's last slot"):
        pool.set_index_k_scale_buffer(0, torch.tensor([512]), torch.zeros(1, 128, dtype=FP8), torch.ones(1))
    with pytest.raises(ValueError, match="index_k: expected rows of index_head_dim = 128"):
        pool.set_index_k_scale_buffer(0, torch.tensor([5]), torch.zeros(1, 126, dtype=FP8), torch.ones(1))
    with pytest.raises(ValueError, match="index_k: expected rows of index_head_dim = 128"):  # narrower: the scale would land among token 5's values
        pool.set_index_k_scale_buffer(0, torch.tensor([5]), torch.zeros(1, 64, dtype=FP8), torch.ones(1))
    assert not buf.any()


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(4))
def test_pool_read_and_write_on_the_gpu_give_sglangs_own_bytes(standin, seed):
    pool_mod = standin((NEWEST,))
    accessor = sys.modules[NEWEST]
    rng = random.Random(100 + seed)
    buffers, lens, pages, total, longest = case(rng, device="cuda", index_dtype=[torch.int32, torch.int64][seed % 2])
    pool = pool_mod.DSATokenToKVPool(buffers)
    want_k, want_s = accessor.GetKAndS.torch_path(pool, buffers[2], pages, lens, total, longest)
    loc, k, s = write_case(rng, 40, 64, device="cuda", scale_2d=seed % 2 == 0)
    want_buf = buffers[0].clone()
    accessor.SetKAndS.torch_path(pool, want_buf, loc, k, s)
    hook.register()
    accessor.calls.clear()
    got_k, got_s = pool.get_index_k_scale_buffer(2, lens, pages, total, longest)
    pool.set_index_k_scale_buffer(0, loc, k, s)
    torch.cuda.synchronize()
    assert accessor.calls == [] and got_k.is_cuda
    assert torch.equal(got_k, want_k) and torch.equal(got_s, want_s) and torch.equal(buffers[0], want_buf)


@pytest.mark.gpu
def test_gpu_page_ids_that_do_not_fit_never_read_another_page(monkeypatch):
    """No host sync by default: a page id outside int32 gives zero rows (not page 1's bytes); a
    length outside int32 counts as 0 rows (docs/contract.md §7: the next request's rows follow,
    from its own page); with NVRTC_GATHER_DEBUG=1 the kernel's ValueError names the argument."""
    buf = torch.randint(0, 256, (4, 64 * 132), dtype=torch.uint8, device="cuda")
    lens = torch.tensor([10, 5], device="cuda")
    pages = torch.tensor([[2**32 + 1], [3]], device="cuda")
    k, s = hook.get_index_k_scale_buffer(buf, lens, pages, 15, 10)
    page3 = buf[3, :5 * 128].view(5, 128)
    assert torch.equal(k[10:], page3) and not k[:10].any() and not s[:10].any()
    lens64 = torch.tensor([2**32 + 10, 5], device="cuda")
    k, s = hook.get_index_k_scale_buffer(buf, lens64, torch.tensor([[1], [3]], device="cuda"), 15, 10)
    assert torch.equal(k[:5], page3) and not k[5:].any() and not s[5:].any()  # page 1 never read
    monkeypatch.setenv("NVRTC_GATHER_DEBUG", "1")
    with pytest.raises(ValueError, match=r"page_indices: row \d+ \(request 0\) maps to page 4294967297"):
        hook.get_index_k_scale_buffer(buf, lens, pages, 15, 10)
    with pytest.raises(ValueError, match="seq_len_tensor: entry 0 = 4294967306 is negative or past int32"):
        hook.get_index_k_scale_buffer(buf, lens64, torch.tensor([[1], [3]], device="cuda"), 15, 10)


@pytest.mark.gpu
def test_the_hooks_remembered_read_still_asks_each_pool_for_its_layout(standin):
    """The hook first tries the read's remembered layout (skipping its own checks of the buffer,
    which that layout passed): a pool whose sizes do not fit the buffer still goes to SGLang, and
    the remembered calls give SGLang's bytes."""
    pool_mod = standin((NEWEST,))
    accessor = sys.modules[NEWEST]
    rng = random.Random(11)
    buffers, lens, pages, total, longest = case(rng, device="cuda", index_dtype=torch.int32)
    pool = pool_mod.DSATokenToKVPool(buffers)
    want = accessor.GetKAndS.torch_path(pool, buffers[1], pages, lens, total, longest)
    hook.register()
    accessor.calls.clear()
    for _ in range(3):  # the first call checks in full; the others take the remembered layout
        got = pool.get_index_k_scale_buffer(1, lens, pages, total, longest)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert accessor.calls == []
    for other in (pool_mod.DSATokenToKVPool(buffers, page_size=32), pool_mod.DSATokenToKVPool(buffers, index_head_dim=64)):
        try:  # what the stand-in's torch path makes of the mismatch does not matter: who ran does
            other.get_index_k_scale_buffer(1, lens, pages, total, longest)
        except RuntimeError:
            pass
    assert accessor.calls == ["sglang"] * 2
    assert set(hook.status()["left_to_sglang"]["GetKAndS.execute"]) == {"page layout"}
