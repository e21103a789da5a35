"""cuda_src/dsv4_gather.cu (DeepSeek-V4's record gathers) on CPU threads under the host emulator:
SGLang's flat forms and vLLM's paged form against the independent reference, outputs poisoned
first; then hostile index values (token ids, block ids, lengths, offsets) inside guard bytes: no
load outside the tensors, no stray byte, bad rows zero (SGLang) or untouched (vLLM), debug mode
reports."""
import random

import pytest
import torch

from helpers import dsv4_reference as ref
from helpers.host_emu import emu_launch, emulator
from helpers.index_fuzz import Arena, Launch, first_difference, launch_problem, pack, run_isolated, span
from nvrtc_gather.kernels import dsv4_gather as spec

POISON = 0xA5


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    return emulator(tmp_path_factory, kernel="dsv4")


def cache_fields(cache, page_size):
    return dict(page_stride=cache.stride(0), num_slots=cache.size(0) * page_size, page_size=page_size,
                num_pages=cache.size(0))


def flat_fields(cache, page_size, out, ids, n):
    return dict(cache_fields(cache, page_size), cache=cache.data_ptr(), out=out.data_ptr(), ids=ids.data_ptr(),
                seq_lens=0, gather_lens=0, rows=out.size(0), num_ids=n,
                out_row_stride=out.stride(0) * out.element_size(), out_req_stride=0, ids_stride=ids.stride(0),
                max_blocks=0, offset=0, tiles_per_req=0)


def paged_fields(k_cache, bs, out, sl, gl, bt, offset):
    rows = out.size(1) - offset
    return dict(cache_fields(k_cache, bs), cache=k_cache.data_ptr(), out=out.data_ptr(), ids=bt.data_ptr(),
                seq_lens=sl.data_ptr(), gather_lens=0 if gl is None else gl.data_ptr(), rows=out.size(1),
                num_ids=out.size(0), out_row_stride=out.stride(1) * 2, out_req_stride=out.stride(0) * 2,
                ids_stride=bt.stride(0), max_blocks=bt.size(1), offset=offset, tiles_per_req=spec.tiles(rows))


@pytest.mark.parametrize("ps", [64, 3, 1])
@pytest.mark.parametrize("fp8_out", [False, True])
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_flat_forms_match_the_reference(emu, ps, fp8_out, ids_dtype):
    cache = ref.build_cache("v4", 7, ps, seed=ps, scale_range=(0, 255))
    n, extra = 45, 2 if fp8_out else 0
    ids = ref.random_token_ids(7, ps, n, seed=ps, dtype=ids_dtype)
    if fp8_out:
        want = ref.gather_dequant_requant_fp8_paged_dsv4(cache, ids, ps, extra_rows=extra)
    else:
        want = ref.dequantize_k_cache_paged_dsv4(cache, ids, ps)
    out = torch.full((n + extra, 1, 512 * want.element_size()), POISON, dtype=torch.uint8).view(want.dtype)
    emu_launch(emu, spec.PARAMS, spec.flat_entry(fp8_out, "i32" if ids_dtype == torch.int32 else "i64"),
               spec.tiles(n + extra), flat_fields(cache, ps, out, ids, n))
    if fp8_out:
        assert torch.equal(out.view(torch.uint8), want.view(torch.uint8))
    else:
        nan = torch.isnan(want.float())
        assert torch.equal(out.view(torch.int16)[~nan], want.view(torch.int16)[~nan])
        assert (out.view(torch.int16)[nan] == 0x7fff).all()


@pytest.mark.parametrize("layout", sorted(spec.V41_LAYOUTS))
@pytest.mark.parametrize("ps", [64, 3, 1])
def test_v41_layouts_match_the_reference(emu, layout, ps):
    """SGLang's V4.1 layouts (bf16 out), scale bytes 0..255 (MXFP8: 0 the subnormal 2^-127, 255
    NaN; FP4: every e4m3 scale), int32 and int64 ids, a page stride past the engines' padding."""
    lay = ref.layout_of(layout)
    cache = ref.build_cache(layout, 7, ps, seed=ps, scale_range=(0, 255), page_bytes=lay.page_bytes(ps) + 48)
    n = 45
    for ids_dtype, it in ((torch.int32, "i32"), (torch.int64, "i64")):
        ids = ref.random_token_ids(7, ps, n, seed=ps, dtype=ids_dtype)
        want = ref.dequantize_k_cache_paged_dsv4(cache, ids, ps, layout=layout)
        out = torch.full((n, 1, 1024), POISON, dtype=torch.uint8).view(torch.bfloat16)
        emu_launch(emu, spec.PARAMS, spec.v41_entry(layout, it), spec.tiles(n), flat_fields(cache, ps, out, ids, n))
        nan = torch.isnan(want.float())
        assert torch.equal(out.view(torch.int16)[~nan], want.view(torch.int16)[~nan]), (layout, it)
        assert (out.view(torch.int16)[nan] == 0x7fff).all()


@pytest.mark.parametrize("seed", range(6))
def test_paged_form_matches_the_reference(emu, seed):
    rng = random.Random(seed)
    bs = rng.choice([64, 16, 2])
    seq = [rng.randint(0, 70) for _ in range(rng.randint(1, 5))]
    nb = sum(-(-s // bs) for s in seq) + 2
    cache = ref.build_cache("v4", nb, bs, seed=seed)
    k_cache = ref.vllm_view(cache, bs)
    bt = ref.random_requests(nb, bs, seq, seed=seed)
    gl = torch.tensor([rng.randint(0, s) for s in seq], dtype=torch.int32) if seed % 2 else None
    sl = torch.tensor(seq, dtype=torch.int32)
    offset = rng.choice([0, 3])
    want = torch.full((len(seq), offset + max(seq) + 2, 1024), POISON, dtype=torch.uint8).view(torch.bfloat16)
    out = want.clone()
    ref.dequantize_and_gather_k_cache(want, k_cache, sl, gl, bt, bs, offset)
    fields = paged_fields(k_cache, bs, out, sl, gl, bt, offset)
    emu_launch(emu, spec.PARAMS, spec.PAGED_ENTRY, len(seq) * fields["tiles_per_req"], fields)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))


# --- index fuzz --------------------------------------------------------------------------------------

def _arena_cache(a, nb, ps, seed, layout="v4"):
    src = ref.build_cache(layout, nb, ps, seed=seed, scale_range=(0, 255) if layout != "v4" else (110, 135))
    buf = a.alloc(src.numel()).view(nb, src.size(1))
    buf.copy_(src)
    return buf


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork() to isolate the launches")
@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_flat_index_fuzz(emu, debug):
    cases, launches = [], []
    for seed in range(32):
        rng = random.Random(f"dsv4-flat-{seed}")
        ps, nb = rng.choice([1, 2, 64]), rng.randint(1, 3)
        dt = rng.choice([torch.int32, torch.int64])
        lim = 2**31 - 1 if dt == torch.int32 else 2**63 - 1
        pool = [-lim - 1, -1, nb * ps, nb * ps + 1, lim, 2**31, 2**32 + 3] if dt == torch.int64 else \
            [-lim - 1, -1, nb * ps, nb * ps + 1, lim]
        fp8 = rng.random() < 0.4
        layout = "v4" if fp8 else rng.choice(["v4", "v4", *spec.V41_LAYOUTS])
        n, extra = rng.randint(1, 40), rng.choice([0, 1, 3]) if fp8 else 0  # extra_rows: the fp8 form's
        ids = [rng.choice(pool) if rng.random() < 0.3 else rng.randrange(nb * ps) for _ in range(n)]
        a = Arena()
        cache = _arena_cache(a, nb, ps, seed, layout)
        it = a.alloc(n * dt.itemsize).view(dt)
        it.copy_(torch.tensor(ids, dtype=dt))
        od = torch.float8_e4m3fn if fp8 else torch.bfloat16
        out = a.alloc((n + extra) * 512 * od.itemsize).view(od).view(n + extra, 1, 512)
        err = a.alloc(32).view(torch.int64)
        err.zero_()
        before = a.bytes.clone()
        it_name = "i32" if dt == torch.int32 else "i64"
        entry = spec.flat_entry(fp8, it_name) if layout == "v4" else spec.v41_entry(layout, it_name)
        launches.append(Launch(entry, spec.tiles(n + extra),
                               pack(spec.PARAMS, flat_fields(cache, ps, out, it, n), err.data_ptr() if debug else 0),
                               [span(cache), span(it)]))
        good = torch.tensor([i if 0 <= i < nb * ps else 0 for i in ids])
        src = cache.clone()
        want = (ref.gather_dequant_requant_fp8_paged_dsv4(src, good, ps, extra_rows=extra) if fp8 else
                ref.dequantize_k_cache_paged_dsv4(src, good, ps, layout=layout)).clone()
        for r, i in enumerate(ids):
            if not 0 <= i < nb * ps:
                want[r] = 0
        cases.append((a, before, cache, it, out, err, want, ids, nb * ps, f"seed {seed} {layout} ps {ps} {dt} ids {ids}"))
    for (a, before, cache, it, out, err, want, ids, slots, desc), outcome in zip(cases, run_isolated(emu, launches)):
        problem = launch_problem(*outcome)
        assert problem is None, f"{problem}: {desc}"
        arena0 = a.bytes.data_ptr()
        expected = before.clone()
        lo = out.data_ptr() - arena0
        w = want.view(torch.uint8).reshape(-1)
        if want.dtype == torch.bfloat16:  # the reference's NaN bits (0x7fc0) are the GPU's 0x7fff
            bits = want.view(torch.int16).clone()
            bits[torch.isnan(want.float())] = 0x7fff
            w = bits.view(torch.uint8).reshape(-1)
        expected[lo: lo + w.numel()] = w
        bad = [r for r, i in enumerate(ids) if not 0 <= i < slots]
        if debug:
            lo = err.data_ptr() - arena0
            expected[lo: lo + 32] = err.view(torch.uint8)
            code, row, value, _ = err.tolist()
            assert (code == 15 and row in bad and value == ids[row]) if bad else code == 0, desc
        regions = {"cache": span(cache), "ids": span(it), "out": span(out), "err": span(err)}
        regions = {k: (v[0] - arena0, v[1] - arena0) for k, v in regions.items()}
        assert torch.equal(a.bytes, expected), f"{first_difference(a.bytes, expected, regions)}: {desc}"


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork() to isolate the launches")
@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_paged_index_fuzz(emu, debug):
    cases, launches = [], []
    for seed in range(16):
        rng = random.Random(f"dsv4-paged-{seed}")
        bs, nb, reqs, mb = rng.choice([2, 16, 64]), rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 3)
        lpool = [-2**31, -1, 0, 1, bs * mb, bs * mb + 1, 2**31 - 1]
        seq = [rng.choice(lpool) if rng.random() < 0.3 else rng.randint(0, bs * mb) for _ in range(reqs)]
        gl = [rng.choice(lpool) if rng.random() < 0.3 else rng.randint(0, 20) for _ in range(reqs)] \
            if rng.random() < 0.5 else None
        bt = [[rng.choice([-1, nb, 2**31 - 1, -2**31]) if rng.random() < 0.2 else rng.randrange(nb)
               for _ in range(mb)] for _ in range(reqs)]
        m, offset = rng.randint(1, 30), rng.randint(0, 3)
        a = Arena()
        cache = _arena_cache(a, nb, bs, seed)
        k_cache = cache.as_strided((nb, bs, 584), (cache.stride(0), 584, 1))
        t_sl = a.alloc(4 * reqs).view(torch.int32)
        t_sl.copy_(torch.tensor(seq, dtype=torch.int32))
        t_gl = None
        if gl is not None:
            t_gl = a.alloc(4 * reqs).view(torch.int32)
            t_gl.copy_(torch.tensor(gl, dtype=torch.int32))
        t_bt = a.alloc(4 * reqs * mb).view(torch.int32).view(reqs, mb)
        t_bt.copy_(torch.tensor(bt, dtype=torch.int32))
        out = a.alloc(reqs * m * 1024).view(torch.bfloat16).view(reqs, m, 512)
        err = a.alloc(32).view(torch.int64)
        err.zero_()
        before = a.bytes.clone()
        fields = paged_fields(k_cache, bs, out, t_sl, t_gl, t_bt, offset)
        if m - offset <= 0:
            continue
        bounds = [span(cache), span(t_sl), span(t_bt)] + ([span(t_gl)] if t_gl is not None else [])
        launches.append(Launch(spec.PAGED_ENTRY, reqs * fields["tiles_per_req"],
                               pack(spec.PARAMS, fields, err.data_ptr() if debug else 0), bounds))
        # expected: each good row of each request written, every other byte as before
        want = out.clone()
        src = cache.clone()
        for r in range(reqs):
            g = seq[r] if gl is None else gl[r]
            for i in range(max(0, g)):
                pos = seq[r] - g + i
                if pos < 0 or offset + i >= m or pos // bs >= mb or not 0 <= bt[r][pos // bs] < nb:
                    continue
                one = torch.zeros(1, 1, 512, dtype=torch.bfloat16)
                ref.dequantize_and_gather_k_cache(one, ref.vllm_view(src, bs), torch.tensor([pos + 1], dtype=torch.int32),
                                                  torch.tensor([1], dtype=torch.int32),
                                                  torch.tensor([[bt[r][pos // bs]] * (pos // bs + 1)], dtype=torch.int32),
                                                  bs, 0)
                want[r, offset + i] = one[0, 0]
        cases.append((a, before, cache, out, err, want, f"seed {seed} bs {bs} seq {seq} gl {gl} bt {bt} m {m} off {offset}"))
    for (a, before, cache, out, err, want, desc), outcome in zip(cases, run_isolated(emu, launches)):
        problem = launch_problem(*outcome)
        assert problem is None, f"{problem}: {desc}"
        arena0 = a.bytes.data_ptr()
        expected = before.clone()
        lo = out.data_ptr() - arena0
        expected[lo: lo + out.numel() * 2] = want.view(torch.uint8).reshape(-1)
        if debug:
            lo = err.data_ptr() - arena0
            expected[lo: lo + 32] = err.view(torch.uint8)
        regions = {"cache": span(cache), "out": span(out), "err": span(err)}
        regions = {k: (v[0] - arena0, v[1] - arena0) for k, v in regions.items()}
        assert torch.equal(a.bytes, expected), f"{first_difference(a.bytes, expected, regions)}: {desc}"
