"""The SGLang adapter against the real SGLang package, where it is installed (the CI matrix,
scripts/engine_matrix.sh, installs one release of each accessor layout, one at a time): the hook
lands on the real classes of that release's accessor module; every call site SGLang has passes (or makes
SGLang's older single-request read, which the hook leaves to SGLang) arguments the hook binds with
the meaning it gives them; and the real ``execute`` methods, called
as SGLang's pools call them (page size as the release reads it, fp8 views, seq_len_sum), give
bytes equal to an independent reading of the layout and to SGLang's own CPU-runnable reads
(``GetK.slow`` / ``GetS.slow``, up to 0.5.20). Skipped without SGLang, unless
NVRTC_GATHER_REQUIRE_SGLANG=1, where a missing or unimportable SGLang fails (``accessor``: the
same, where only the wheel and its accessor's imports are installed, as on the GPU machine)."""
import ast
import importlib.metadata
import importlib.util
import os
import random
from types import SimpleNamespace

import pytest
import torch

from nvrtc_gather.integrations import sglang as hook
from nvrtc_gather.integrations import sglang_dsv4
from helpers.sglang_v4_releases import KERNELS, SRT, v4_hooks

FP8 = torch.float8_e4m3fn


def _release():
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def _key(v: str):
    return tuple(int(x) for x in v.split(".")[:3] if x.isdigit())


@pytest.fixture(scope="module")
def accessor():
    release = _release()
    if release is None:
        msg = "SGLang is not installed here (scripts/engine_matrix.sh installs the real releases)"
        if os.environ.get("NVRTC_GATHER_REQUIRE_SGLANG") in ("1", "accessor"):
            pytest.fail(msg)
        pytest.skip(msg)
    names = hook.register()  # an unknown layout or a missing dependency fails here, with its cause
    try:
        yield release, names, importlib.import_module(names[0]) if names else None
    finally:
        hook.unregister()


def expected_module(release: str) -> str:
    """The module the release keeps the accessor in (ACCESSORS: the newest the release has)."""
    for name, introduced in hook.ACCESSORS:
        if _key(release) >= _key(introduced):
            return name
    pytest.fail(f"SGLang {release} is older than every release nvrtc_gather knows")


def test_the_hook_lands_on_the_real_classes(accessor):
    release, names, module = accessor
    assert names == (expected_module(release),), f"SGLang {release}"
    for cls in ("GetKAndS", "SetKAndS"):
        assert hook._TAG in getattr(module, cls).__dict__
    v4 = v4_hooks(release)
    assert hook.status()["hooked"] == {"GetKAndS.execute": names[0], "SetKAndS.execute": names[0], **v4}
    assert sglang_dsv4.present() == bool(v4), f"SGLang {release}"


V4_BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend"  # binds the V4 gathers by from-import
V32_DEQUANT = ("sglang.kernels.ops.attention.dsa.dequant_k_cache",  # DeepSeek-V3.2's namesakes, 0.5.16 on
               "sglang.srt.layers.attention.dsa.dequant_k_cache")  # 0.5.13-0.5.15
V32_BACKEND = "sglang.srt.layers.attention.dsa_backend"


def test_the_v4_backend_binds_ours_and_v3_2s_namesakes_stay_sglangs(accessor):
    """In the real package, with the hook in place: SGLang's V4 attention backend imports the
    gathers by name from the module the hook patched (read in its source), and calls ours where
    it imports on CPU (0.5.13-0.5.15's backends need the GPU-only cutlass package); DeepSeek-V3.2's
    functions of the same names (another layout, in the dsa module) stay SGLang's."""
    release = accessor[0]
    v4 = v4_hooks(release)
    if not v4:
        assert not any(_has(m) for m in (KERNELS, SRT)), f"SGLang {release} has DeepSeek-V4 gathers after all"
        return
    where = next(iter(v4.values()))
    assert not any(_has(m) for m in (KERNELS, SRT) if m != where), f"SGLang {release}: a second V4 module"
    spec = importlib.util.find_spec(V4_BACKEND)
    tree = ast.parse(open(spec.origin, encoding="utf-8").read())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == where for a in n.names}
    assert set(v4) <= imported, f"SGLang {release}: {V4_BACKEND} imports {sorted(imported)} from {where}"
    defining = importlib.import_module(where)
    v32 = importlib.import_module(next(m for m in V32_DEQUANT if _has(m)))
    for name in v4:
        assert hasattr(getattr(defining, name), sglang_dsv4._TAG), f"SGLang {release}: {where}.{name}"
    for name in (n for names in sglang_dsv4.NAMES.values() for n in names):
        assert not hasattr(getattr(v32, name, None), sglang_dsv4._TAG), f"SGLang {release}: {v32.__name__}.{name}"
    try:
        backend, v32_backend = importlib.import_module(V4_BACKEND), importlib.import_module(V32_BACKEND)
    except ImportError as e:
        if os.environ.get("NVRTC_GATHER_REQUIRE_SGLANG") == "accessor" and not str(getattr(e, "name", "")).startswith(
                "sglang"):  # only the wheel and its accessor's imports here (the device): the engine matrix has the rest
            pytest.skip(f"SGLang {release}: the backends' imports are not installed here ({e}); the source check "
                        "above stands, scripts/engine_matrix.sh imports them")
        assert "cutlass" in str(e), f"SGLang {release}: {e}"  # a GPU-only package: the source check above stands
        return
    for name in v4:
        assert hasattr(getattr(backend, name), sglang_dsv4._TAG), f"SGLang {release}: {V4_BACKEND}.{name}"
    for name in (n for names in sglang_dsv4.NAMES.values() for n in names):
        assert not hasattr(getattr(v32_backend, name, None), sglang_dsv4._TAG), f"SGLang {release}: {V32_BACKEND}.{name}"


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package missing
        return False


def _call_sites(root: str):
    """(file, line, call) of every ``<module>.GetKAndS.execute(...)`` / ``SetKAndS`` call in the
    installed package whose <module> is an accessor module imported under some name."""
    found = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            text = open(path, encoding="utf-8").read()
            if "KAndS.execute(" not in text:
                continue
            tree = ast.parse(text)
            aliases = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module:
                    for a in node.names:
                        if f"{node.module}.{a.name}" in hook.MODULES:  # not DeepSeek-V4's own accessor
                            aliases.add(a.asname or a.name)
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "execute" \
                        and isinstance(node.func.value, ast.Attribute) and node.func.value.attr in ("GetKAndS", "SetKAndS") \
                        and isinstance(node.func.value.value, ast.Name) and node.func.value.value.id in aliases:
                    found.append((os.path.relpath(path, root), node.lineno, node.func.value.attr, node))
    return found


def test_every_call_site_passes_what_the_hook_binds(accessor, monkeypatch):
    release, names, module = accessor
    root = list(importlib.import_module("sglang").__path__)[0]
    sites = _call_sites(root)
    assert {cls for _, _, cls, _ in sites} == {"GetKAndS", "SetKAndS"}, f"SGLang {release}: call sites {sites}"
    for path, line, cls, call in sites:
        bind = hook._get_args if cls == "GetKAndS" else hook._set_args
        args = [object()] * len(call.args)
        kwargs = {k.arg: object() for k in call.keywords}
        try:
            bind(*args, **kwargs)
        except TypeError as e:
            if cls == "GetKAndS" and "seq_len" in kwargs:  # the older single-request call (0.5.12's V4 pool):
                with monkeypatch.context() as m:  # documented as SGLang's own path
                    m.setattr(hook, "_leave", lambda *a: None)
                    assert hook._get_hook(lambda *a, **k: "sglang's")(None, *args, **kwargs) == "sglang's", \
                        f"SGLang {release} {path}:{line}"
                continue
            pytest.fail(f"SGLang {release} {path}:{line} calls {cls}.execute with arguments the hook does not bind: {e}")


def reference_read(buf, lens, pages, page_size):
    """The layout read by hand: page p holds page_size * 128 fp8 bytes, then page_size fp32 scales."""
    ks, ss = [], []
    for r, n in enumerate(lens):
        for i in range(n):
            p, t = int(pages[r, i // page_size]), i % page_size
            ks.append(buf[p, t * 128:(t + 1) * 128])
            ss.append(buf[p, page_size * 128 + 4 * t: page_size * 128 + 4 * (t + 1)])
    empty = torch.empty(0, 128, dtype=torch.uint8)
    return (torch.stack(ks) if ks else empty), (torch.stack(ss) if ss else empty[:, :4])


def make_pool(release, page_size):
    """The attributes SGLang's accessor reads of its pool; from 0.5.22 the index buffer's pages
    hold index_page_size tokens (page_size // index_kpool: here index_kpool = 2)."""
    pool = SimpleNamespace(page_size=page_size, index_head_dim=128, quant_block_size=128, device=torch.device("cpu"))
    if _key(release) >= (0, 5, 22):
        pool.page_size, pool.index_page_size = 2 * page_size, page_size
    return pool


@pytest.mark.parametrize("seed", range(5))
def test_real_read_is_bit_exact(accessor, seed):
    release, _, module = accessor
    rng = random.Random(seed)
    page_size, num_pages = 64, 30
    pool = make_pool(release, page_size)
    buf = torch.randint(0, 256, (num_pages, page_size * 132), dtype=torch.uint8)
    lens = [rng.choice([0, 1, 63, 64, 65, rng.randint(1, 300)]) for _ in range(rng.randint(1, 6))]
    max_pages = max(1, -(-max(lens) // page_size))
    dtype = [torch.int32, torch.int64][seed % 2]
    order = rng.sample(range(num_pages), num_pages)
    pages = torch.tensor([[order[(r * max_pages + j) % num_pages] for j in range(max_pages)] for r in range(len(lens))],
                         dtype=dtype)
    total = sum(lens)
    k, s = module.GetKAndS.execute(pool, buf, page_indices=pages, seq_len_tensor=torch.tensor(lens, dtype=dtype),
                                   seq_len_sum=total + 3, max_seq_len=max(lens))
    k_ref, s_ref = reference_read(buf, lens, pages, page_size)
    assert k.shape == (total + 3, 128) and s.shape == (total + 3, 4)
    assert torch.equal(k[:total], k_ref) and torch.equal(s[:total], s_ref)
    assert not k[total:].any() and not s[total:].any()  # past the lengths' sum: zero
    if hasattr(module, "GetK") and hasattr(module.GetK, "slow"):  # SGLang's own CPU-runnable read
        for r, n in enumerate(lens):
            if n:
                start = sum(lens[:r])
                assert torch.equal(k[start:start + n], module.GetK.slow(pool, buf, n, pages[r]))
                assert torch.equal(s[start:start + n], module.GetS.slow(pool, buf, n, pages[r]))
    assert hook.status()["left_to_sglang"].get("GetKAndS.execute", {}) == {}


@pytest.mark.parametrize("seed", range(5))
def test_real_write_is_bit_exact(accessor, seed):
    release, _, module = accessor
    rng = random.Random(50 + seed)
    page_size, num_pages = 64, 6
    pool = make_pool(release, page_size)
    buf = torch.randint(0, 256, (num_pages, page_size * 132), dtype=torch.uint8)
    n = rng.randint(1, 120)
    slots = rng.sample(range(num_pages * page_size), n)
    loc = torch.tensor(slots, dtype=[torch.int64, torch.int32][seed % 2])
    k = torch.randint(0, 256, (n, 128), dtype=torch.uint8).view(FP8)
    scale = torch.rand(n, 1) if seed % 3 == 0 else torch.rand(n)
    want = buf.clone()
    for i, slot in enumerate(slots):
        p, t = divmod(slot, page_size)
        want[p, t * 128:(t + 1) * 128] = k[i].view(torch.uint8)
        want[p, page_size * 128 + 4 * t: page_size * 128 + 4 * (t + 1)] = scale.reshape(-1)[i:i + 1].view(torch.uint8)
    module.SetKAndS.execute(pool=pool, buf=buf, loc=loc, index_k=k, index_k_scale=scale)
    assert torch.equal(buf, want)
    assert hook.status()["left_to_sglang"].get("SetKAndS.execute", {}) == {}
