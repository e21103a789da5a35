"""indexer_k_quant_and_cache without a GPU: the kernel's fp8 encoder (emulated in numpy and,
where a C compiler exists, the .cuh text itself compiled for the host) against torch's
conversion, the scale arithmetic, the torch (CPU) path against the independent per-token
reference, the kernel choice, and every bad argument."""
import ctypes
import random
import shutil
import subprocess

import numpy as np
import pytest
import torch

import nvrtc_gather as ng
from nvrtc_gather.ops import indexer_k_quant
from nvrtc_gather.jit import sources
from nvrtc_gather.ops.indexer_k_quant_torch import block_scales
from helpers.reference import make_quant_case, quant_reference

FP8 = torch.float8_e4m3fn
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


# --- the fp8 encoder ------------------------------------------------------------------------

def emulate_device_fp8(x: np.ndarray) -> np.ndarray:
    """numpy transliteration of ng_fp8e4m3_from_f32 (cuda_src/fp8_e4m3.cuh), uint32 wrapping."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    sign = (bits >> np.uint32(24)) & np.uint32(0x80)
    a = bits & np.uint32(0x7FFFFFFF)
    big = np.where(a > np.uint32(0x7F800000), np.uint32(0x7F), np.uint32(0x7E))
    with np.errstate(all="ignore"):
        sub = (a.view(np.float32) + np.float32(16384.0)).view(np.uint32) - np.uint32(0x46800000)
        norm = (a + np.uint32(0xC407FFFF) + ((a >> np.uint32(20)) & np.uint32(1))) >> np.uint32(20)
    r = np.where(a > np.uint32(0x43E80000), big, np.where(a < np.uint32(0x3C800000), sub, norm))
    return np.where(a > np.uint32(0x7F800000), np.uint32(0x7F), r | sign).astype(np.uint8)


def torch_fp8(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(FP8).view(torch.uint8).numpy()


def encoder_inputs(random_count=1 << 20) -> np.ndarray:
    """Every fp16 value; every exponent x the mantissa bits that decide e4m3 rounding x the
    dropped bits at and around the tie; e4m3's subnormal range densely with its ties and
    their neighbours; the saturation edges; inf, NaNs, zeros; random bit patterns and values."""
    rng = np.random.default_rng(1234)
    parts = [np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)]
    e = np.arange(256, dtype=np.uint32)[:, None, None] << np.uint32(23)
    m = np.arange(16, dtype=np.uint32)[None, :, None] << np.uint32(19)  # 3 kept bits + the top dropped one
    low = np.array([0, 1, 0x3FFFF, 0x7FFFF, 0x40000, 0x7FFFE, 0x12345], dtype=np.uint32)[None, None, :]
    structured = (e | m | low).ravel()
    parts += [structured.view(np.float32), (structured | np.uint32(0x80000000)).view(np.float32)]
    sub = (np.arange(1200, dtype=np.float64) * 2.0 ** -13).astype(np.float32)  # ties at odd multiples of 2^-10
    parts += [sub, np.nextafter(sub, np.float32(np.inf)), np.nextafter(sub, np.float32(0)), -sub]
    edges = np.array([448, 464, 480, 496, 512, 2.0 ** -6, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -10, 1e30, 3.4e38],
                     dtype=np.float32)
    parts += [edges, np.nextafter(edges, np.float32(np.inf)), np.nextafter(edges, np.float32(0)), -edges]
    specials = np.array([0x7F800000, 0xFF800000, 0x7F800001, 0x7FC00000, 0xFFC00000, 0x7FFFFFFF, 0xFFFFFFFF,
                         0, 0x80000000, 1, 0x80000001, 0x007FFFFF, 0x7F7FFFFF], dtype=np.uint32)
    parts.append(specials.view(np.float32))
    parts.append(rng.integers(0, 1 << 32, random_count, dtype=np.uint64).astype(np.uint32).view(np.float32))
    parts.append((rng.standard_normal(random_count) * 300).astype(np.float32))
    parts.append((rng.standard_normal(random_count) * 2.0 ** -8).astype(np.float32))
    return np.concatenate(parts)


def _assert_same(got, want, x):
    """Equal to torch wherever torch versions agree; |x| >= 464 (including inf) saturates to
    ±448 (0x7e, 0xfe) as torch >= 2.13 does (older torch gives NaN there; scaled values
    never get that far: they stay <= 448 by construction); every NaN is 0x7f, as CUDA's
    __nv_cvt_float_to_fp8 (vLLM's conversion) gives it, where torch keeps the NaN's sign."""
    sat = ~np.isnan(x) & (np.abs(x) >= 464)
    want = np.where(sat, np.where(np.signbit(x), 0xFE, 0x7E), want).astype(want.dtype)
    want = np.where(np.isnan(x), 0x7F, want).astype(want.dtype)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, [(hex(int(x.view(np.uint32)[i])), float(x[i]), int(want[i]), int(got[i])) for i in bad[:8]]


def test_emulated_encoder_matches_torch():
    x = encoder_inputs()
    _assert_same(emulate_device_fp8(x), torch_fp8(x), x)


@pytest.fixture(scope="module")
def host_encoder(tmp_path_factory):
    """The encoder's own source, compiled for the host (the header is plain C outside CUDA)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler on this machine to build cuda_src/fp8_e4m3.cuh for the host")
    d = tmp_path_factory.mktemp("fp8-host")
    (d / "fp8_e4m3.cuh").write_text(sources.read_source("fp8_e4m3.cuh"))
    (d / "enc.c").write_text(
        '#include <stddef.h>\n#include "fp8_e4m3.cuh"\n'
        "void encode(const float* x, unsigned char* out, size_t n) {\n"
        "    for (size_t i = 0; i < n; ++i) out[i] = (unsigned char)ng_fp8e4m3_from_f32(x[i]);\n}\n")
    lib = d / "libenc.so"
    r = subprocess.run([cc, "-O2", "-std=c99", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC",
                        str(d / "enc.c"), "-o", str(lib)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"host build of fp8_e4m3.cuh failed: {r.stderr[:500]}")
    enc = ctypes.CDLL(str(lib)).encode
    enc.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)

    def run(x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty(x.size, dtype=np.uint8)
        enc(x.ctypes.data, out.ctypes.data, x.size)
        return out
    return run


def test_header_encoder_compiled_for_the_host_matches_torch(host_encoder):
    x = encoder_inputs(random_count=1 << 22)
    _assert_same(host_encoder(x), torch_fp8(x), x)


# --- scales ---------------------------------------------------------------------------------

def _scale_reference(amax: np.ndarray, ue8m0: bool) -> np.ndarray:
    s = np.maximum(amax.astype(np.float32), np.float32(1e-4)) / np.float32(448.0)
    if ue8m0:
        m, e = np.frexp(s.astype(np.float64))
        s = np.where(m == 0.5, np.ldexp(1.0, e - 1), np.ldexp(1.0, e)).astype(np.float32)
    return s


@pytest.mark.parametrize("ue8m0", [False, True])
def test_block_scales(ue8m0):
    rng = np.random.default_rng(5)
    powers = (448.0 * 2.0 ** np.arange(-20, 100)).astype(np.float32)  # exact power-of-two scales, above 1e-4
    amax = np.concatenate([
        powers, np.nextafter(powers, np.float32(np.inf)), np.nextafter(powers, np.float32(0)),
        np.array([0, 1e-4, 9.99e-5, 1.0001e-4, 1e-30, 3.4e38, 448, 1], dtype=np.float32),
        np.abs(rng.standard_normal(100000) * 10.0 ** rng.uniform(-8, 6, 100000)).astype(np.float32),
    ])
    got = block_scales(torch.from_numpy(amax), ue8m0).numpy()
    want = _scale_reference(amax, ue8m0)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    if ue8m0:  # exact powers stay; one ulp above doubles
        n = powers.size
        assert np.array_equal(got[:n], powers / np.float32(448))
        assert np.array_equal(got[n:2 * n], 2 * powers / np.float32(448))


# --- the torch path against the reference ---------------------------------------------------

def _grid():
    out = []
    for hd in (64, 128, 256, 512):
        for qbs in [q for q in (32, 64, 128, 256, 512) if q <= hd]:
            for bs in (1, 16, 64):
                for dt in DTYPES:
                    for fmt in ("ue8m0", "fp8_e4m3"):
                        out.append(pytest.param(hd, qbs, bs, dt, fmt, id=f"hd{hd}-q{qbs}-bs{bs}-{dt}-{fmt}"))
    return out


def check_cpu(case):
    """Run the op on the CPU case and compare every byte of the cache and its guards."""
    want = quant_reference(case.k, case.kv_cache, case.slot_mapping, case.quant_block_size, case.scale_fmt)
    outside = case.outside_cache().clone()
    ng.indexer_k_quant_and_cache(*case.args())
    assert torch.equal(case.kv_cache.contiguous(), want), case.desc
    assert torch.equal(case.outside_cache(), outside), case.desc


@pytest.mark.parametrize("hd,qbs,bs,dt,fmt", _grid())
def test_cpu_matches_reference_on_grid(hd, qbs, bs, dt, fmt):
    rng = random.Random(f"{hd}-{qbs}-{bs}-{dt}-{fmt}")
    check_cpu(make_quant_case(rng, head_dim=hd, quant_block_size=qbs, block_size=bs, dtype=DTYPES[dt],
                              scale_fmt=fmt, num_tokens=rng.randint(1, 90), extra_rows=rng.choice([0, 0, 5]),
                              k_row_pad=rng.choice([0, 0, 4, 1]), k_offset=rng.choice([0, 0, 2, 1]),
                              block_pad=rng.choice([0, 0, 16, 4])))


@pytest.mark.parametrize("hd,qbs", [(4, 1), (4, 2), (12, 3), (12, 4), (48, 12), (192, 96), (192, 64), (96, 96)])
@pytest.mark.parametrize("dt", DTYPES)
def test_unusual_quant_block_sizes(hd, qbs, dt):
    rng = random.Random(hd * 1000 + qbs)
    for fmt in ("ue8m0", "fp8_e4m3"):
        check_cpu(make_quant_case(rng, head_dim=hd, quant_block_size=qbs, block_size=4, dtype=DTYPES[dt],
                                  scale_fmt=fmt, num_tokens=30, extra_rows=2))


def test_padding_short_slot_mapping_and_unused_rows():
    """Slots -1 are skipped; rows of k past len(slot_mapping) hold NaN/inf and are never read."""
    rng = random.Random(3)
    case = make_quant_case(rng, head_dim=128, quant_block_size=64, block_size=16, dtype=torch.bfloat16,
                           scale_fmt="ue8m0", num_tokens=40, extra_rows=25, pad_frac=0.5)
    assert int((case.slot_mapping < 0).sum()) > 5
    check_cpu(case)


@pytest.mark.parametrize("slots", [[], [-1], [-1, -1, -1]])
def test_nothing_to_write_is_a_no_op(slots):
    k = torch.randn(4, 128, dtype=torch.bfloat16)
    kv = torch.randint(0, 256, (2, 16, 132), dtype=torch.uint8)
    before = kv.clone()
    ng.indexer_k_quant_and_cache(k, kv, torch.tensor(slots, dtype=torch.int64), 128, "ue8m0")
    assert torch.equal(kv, before)


def test_scale_fmt_aliases_and_fp8_cache_dtype():
    """"fp8e4m3", "" and None mean plain scales like "fp8_e4m3"; a float8_e4m3fn cache is written the same."""
    rng = random.Random(9)
    case = make_quant_case(rng, head_dim=128, quant_block_size=128, block_size=64, dtype=torch.bfloat16,
                           scale_fmt="fp8_e4m3", num_tokens=20)
    want = quant_reference(case.k, case.kv_cache, case.slot_mapping, 128, "fp8_e4m3")
    for fmt in ("fp8e4m3", "", None):
        kv = case.kv_cache.clone().view(FP8)
        ng.indexer_k_quant_and_cache(case.k, kv, case.slot_mapping, np.int64(128), fmt)
        assert torch.equal(kv.view(torch.uint8), want)


def test_tiny_and_huge_quant_blocks():
    """amax below the 1e-4 floor, and scales far from 1, in both formats."""
    k = torch.tensor([[1e-9, -2e-7, 3e-5, 5e-5] * 8, [3e4, -1e3, 7.0, 2e-3] * 8], dtype=torch.float32)
    for fmt in ("ue8m0", "fp8_e4m3"):
        kv = torch.randint(0, 256, (1, 2, 36), dtype=torch.uint8)
        want = quant_reference(k, kv, torch.tensor([1, 0]), 32, fmt)
        ng.indexer_k_quant_and_cache(k, kv, torch.tensor([1, 0]), 32, fmt)
        assert torch.equal(kv, want)
    assert kv[0, 1, 32:].view(torch.float32).item() == np.float32(1e-4) / np.float32(448)


def test_slot_past_the_cache_raises_before_writing():
    k = torch.randn(5, 128)
    kv = torch.randint(0, 256, (2, 16, 132), dtype=torch.uint8)
    before = kv.clone()
    with pytest.raises(ValueError, match=r"slot_mapping: entry 3 = 32 is past the cache's last slot \(32 slots"):
        ng.indexer_k_quant_and_cache(k, kv, torch.tensor([0, 5, -1, 32, 1]), 128, "ue8m0")
    assert torch.equal(kv, before)


# --- which kernel the GPU would run -----------------------------------------------------------

@pytest.mark.parametrize("dt,hd,qbs,row,offset,vec,tpp", [
    ("bf16", 128, 128, 128, 0, 16, 16),
    ("f16", 512, 32, 512, 0, 16, 4),
    ("f32", 128, 128, 128, 0, 16, 8),
    ("bf16", 128, 128, 132, 0, 8, 8),    # 264-byte rows: 8-byte aligned only
    ("bf16", 128, 128, 128, 4, 8, 8),    # data pointer 8 bytes past a 16-byte boundary
    ("bf16", 128, 128, 130, 0, 0, 0),    # 260-byte rows: generic kernel
    ("bf16", 128, 4, 128, 0, 8, 8),      # 8 elements do not divide the quant block; 4 do
    ("f32", 128, 2, 128, 0, 8, 4),
    ("bf16", 12, 3, 12, 0, 0, 0),
    ("bf16", 4096, 128, 4096, 0, 0, 0),  # more lanes per token than threads per block
    ("bf16", 2048, 128, 2048, 0, 16, 1),
])
def test_kernel_choice(dt, hd, qbs, row, offset, vec, tpp):
    store = torch.zeros(offset + 2 * row + 64, dtype=DTYPES[dt])
    k = store.as_strided((2, hd), (row, 1), offset)
    kv = torch.zeros(2, 16, hd + 4 * (hd // qbs), dtype=torch.uint8)
    plan = indexer_k_quant.plan_quant(k, kv, torch.zeros(2, dtype=torch.int64), qbs, "ue8m0")
    if store.data_ptr() % 16 == 0:
        assert (plan.vec, plan.tokens_per_pass) == (vec, tpp)
    assert plan.block_stride == 16 * kv.size(2) and plan.k_row_stride == row * store.element_size()


# --- bad arguments ----------------------------------------------------------------------------

def good():
    return dict(k=torch.randn(8, 128, dtype=torch.bfloat16),
                kv_cache=torch.randint(0, 256, (4, 16, 132), dtype=torch.uint8),
                slot_mapping=torch.tensor([0, 17, -1, 40, 63, 2], dtype=torch.int64),
                quant_block_size=128, scale_fmt="ue8m0")


def call(a):
    ng.indexer_k_quant_and_cache(a["k"], a["kv_cache"], a["slot_mapping"], a["quant_block_size"], a["scale_fmt"])


def test_good_arguments_pass():
    a = good()
    before = a["kv_cache"].clone()
    call(a)
    assert not torch.equal(a["kv_cache"], before)


CASES = [
    ("k", lambda a: a["k"].float().numpy(), TypeError, "k: expected a torch.Tensor"),
    ("k", lambda a: a["k"].to(torch.int32), TypeError, "k: expected dtype"),
    ("k", lambda a: a["k"].view(torch.int16), TypeError, "k: expected dtype"),
    ("k", lambda a: a["k"].flatten(), ValueError, "k: expected 2 dimensions"),
    ("k", lambda a: a["k"][:, :126], ValueError, "k: head_dim"),
    ("k", lambda a: torch.randn(128, 8, dtype=torch.bfloat16).t(), ValueError, "k: the last dimension"),
    ("k", lambda a: torch.randn(5, 128), ValueError, "slot_mapping: 6 entries, more than the 5 rows of k"),
    ("k", lambda a: a["k"].to("meta"), ValueError, "k: expected a tensor on cpu like kv_cache"),
    ("kv_cache", lambda a: [1, 2], TypeError, "kv_cache: expected a torch.Tensor"),
    ("kv_cache", lambda a: a["kv_cache"].float(), TypeError, "kv_cache: expected dtype"),
    ("kv_cache", lambda a: a["kv_cache"].flatten(1), ValueError, "kv_cache: expected 3 dimensions"),
    ("kv_cache", lambda a: torch.zeros(4, 16, 140, dtype=torch.uint8)[:, :, :132], ValueError,
     "kv_cache: each block must be contiguous"),
    ("kv_cache", lambda a: a["kv_cache"].transpose(0, 1), ValueError, "kv_cache: each block must be contiguous"),
    ("kv_cache", lambda a: torch.zeros(4, 16, 131, dtype=torch.uint8), ValueError, "kv_cache: cache_stride"),
    ("kv_cache", lambda a: torch.zeros(4, 0, 132, dtype=torch.uint8), ValueError, "kv_cache: block_size"),
    ("kv_cache", lambda a: torch.zeros(4 * 16 * 132 + 1, dtype=torch.uint8)[1:].view(4, 16, 132), ValueError,
     "kv_cache: data pointer"),
    ("kv_cache", lambda a: torch.zeros(4, 16 * 132 + 2, dtype=torch.uint8)[:, :16 * 132].view(4, 16, 132),
     ValueError, "kv_cache: stride"),
    ("slot_mapping", lambda a: a["slot_mapping"].int(), TypeError, "slot_mapping: expected dtype torch.int64"),
    ("slot_mapping", lambda a: a["slot_mapping"].view(2, 3), ValueError, "slot_mapping: expected 1 dimensions"),
    ("slot_mapping", lambda a: torch.arange(12)[::2], ValueError, "slot_mapping: the last dimension"),
    ("slot_mapping", lambda a: torch.arange(9), ValueError, "slot_mapping: 9 entries, more than the 8 rows"),
    ("slot_mapping", lambda a: torch.tensor([0, 64]), ValueError, "slot_mapping: entry 1 = 64 is past"),
    ("slot_mapping", lambda a: a["slot_mapping"].to("meta"), ValueError, "slot_mapping: expected a tensor on cpu"),
    ("quant_block_size", lambda a: 128.0, TypeError, "quant_block_size: expected an int, got float"),
    ("quant_block_size", lambda a: True, TypeError, "quant_block_size: expected an int, got bool"),
    ("quant_block_size", lambda a: "128", TypeError, "quant_block_size: expected an int, got str"),
    ("quant_block_size", lambda a: 0, ValueError, "quant_block_size: must be a positive divisor of head_dim=128"),
    ("quant_block_size", lambda a: 48, ValueError, "quant_block_size: must be a positive divisor"),
    ("quant_block_size", lambda a: 256, ValueError, "quant_block_size: must be a positive divisor"),
    ("quant_block_size", lambda a: torch.tensor(128.0), TypeError,
     "quant_block_size: expected an int, got a torch.float32 tensor"),
    ("quant_block_size", lambda a: torch.tensor([128, 128]), TypeError, "quant_block_size: expected an int"),
    # k or slot_mapping in memory the op writes: a race on a GPU.
    ("k", lambda a: a["kv_cache"].view(-1)[: 8 * 256].view(torch.bfloat16).view(8, 128), ValueError,
     "kv_cache: its memory overlaps k"),
    ("k", lambda a: a["kv_cache"].view(-1)[-512:-256].view(torch.bfloat16).as_strided((8, 128), (0, 1)), ValueError,
     "kv_cache: its memory overlaps k"),
    ("slot_mapping", lambda a: a["kv_cache"].view(-1)[1024: 1024 + 48].view(torch.int64), ValueError,
     "kv_cache: its memory overlaps slot_mapping"),
    ("scale_fmt", lambda a: "UE8M0", ValueError, "scale_fmt: expected \"ue8m0\""),
    ("scale_fmt", lambda a: "other", ValueError, "scale_fmt: expected \"ue8m0\""),
    ("scale_fmt", lambda a: "fp8", ValueError, "scale_fmt: expected \"ue8m0\""),
    ("scale_fmt", lambda a: 1, TypeError, "scale_fmt: expected a str"),
    ("scale_fmt", lambda a: ["ue8m0"], TypeError, "scale_fmt: expected a str"),
]


@pytest.mark.parametrize("name,make,exc,match", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_argument_raises_naming_it_and_writes_nothing(name, make, exc, match):
    a = good()
    a[name] = make(a)
    kv = a["kv_cache"]
    before = kv.clone() if isinstance(kv, torch.Tensor) and kv.device.type == "cpu" else None
    with pytest.raises(exc, match=match):
        call(a)
    if before is not None:
        assert torch.equal(kv, before)


def test_int_like_quant_block_size_is_accepted():
    for qbs in (torch.tensor(128), torch.tensor([128])[0]):
        a = good()
        a["quant_block_size"] = qbs
        call(a)


def test_disjoint_views_of_one_buffer_are_accepted():
    """The overlap check compares address ranges: k, slot_mapping and the cache may be
    views into one buffer as long as they do not overlap."""
    a = good()
    b = {n: x.clone() if isinstance(x, torch.Tensor) else x for n, x in a.items()}
    kv_bytes, k_bytes = 4 * 16 * 132, 8 * 256
    buf = torch.zeros(kv_bytes + k_bytes + 48, dtype=torch.uint8)
    buf[:kv_bytes] = a["kv_cache"].view(-1)
    buf[kv_bytes: kv_bytes + k_bytes] = a["k"].view(torch.uint8).view(-1)
    buf[kv_bytes + k_bytes:] = a["slot_mapping"].view(torch.uint8)
    a["kv_cache"] = buf[:kv_bytes].view(4, 16, 132)
    a["k"] = buf[kv_bytes: kv_bytes + k_bytes].view(torch.bfloat16).view(8, 128)
    a["slot_mapping"] = buf[kv_bytes + k_bytes:].view(torch.int64)
    call(a)
    call(b)
    assert torch.equal(a["kv_cache"], b["kv_cache"])


# --- +-inf, NaN and overflow in k: the bytes vLLM's kernel writes (issue #26 item 5) ----------
# vLLM's indexer_k_quant_and_cache_kernel (csrc/libtorch_stable/cache_kernels.cu @00eb0c87):
# scale = fmaxf(amax, 1e-4) / 448 (ue8m0: exp2f(ceilf(log2f(scale)))), values
# __nv_cvt_float_to_fp8(k / scale, __NV_SATFINITE, __NV_E4M3): an inf makes the block's scale
# inf, its finite values +-0 (0x00 / 0x80) and the infs NaN, code 0x7f (never 0xff).

@pytest.mark.parametrize("fmt", ["ue8m0", "fp8_e4m3"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_inf_in_k_writes_vllms_bytes(fmt, dtype):
    k = torch.randn(4, 128, generator=torch.Generator().manual_seed(9)).to(DTYPES[dtype])
    k[1, 3], k[1, 4], k[2, 70], k[3, 0], k[3, 1] = float("inf"), float("-inf"), float("-inf"), -2.0, float("inf")
    kv = torch.full((1, 16, 136), 0xA5, dtype=torch.uint8)
    ng.indexer_k_quant_and_cache(k, kv, torch.tensor([0, 1, 2, 3]), 64, fmt)
    vals, scales = kv[0].view(-1)[:16 * 128].view(16, 128), kv[0].view(-1)[16 * 128:].view(16, 8)
    inf_blocks = [(1, 0), (2, 1), (3, 0)]
    for row, q in inf_blocks:
        block, src = vals[row, 64 * q: 64 * q + 64], k[row, 64 * q: 64 * q + 64].float()
        want = torch.where(torch.isinf(src), 0x7F, torch.where(torch.signbit(src), 0x80, 0x00)).to(torch.uint8)
        assert torch.equal(block, want), (row, q, block.tolist())
        assert scales[row, 4 * q: 4 * q + 4].view(torch.float32).item() == float("inf")
    assert not bool((vals == 0xFF).any())
    ref = torch.full_like(kv, 0xA5)  # the other blocks: as if the infs were not there
    ng.indexer_k_quant_and_cache(k[0:1], ref, torch.tensor([0]), 64, fmt)
    assert torch.equal(vals[0], ref[0].view(-1)[:128]) and torch.equal(scales[0], ref[0].view(-1)[16 * 128:][:8])


@pytest.mark.parametrize("fmt", ["ue8m0", "fp8_e4m3"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_nan_in_k_is_left_out_of_amax_as_vllms_fmaxf_does(fmt, dtype):
    """vLLM's kernel takes amax with fmaxf, which returns the other operand for a NaN: the NaNs
    of a quant block are left out of its amax (a block of NaNs has amax 0: scale 1e-4 / 448),
    its other values are quantized as if the NaNs were zeros, and the NaNs are 0x7f."""
    k = torch.randn(4, 128, generator=torch.Generator().manual_seed(10)).to(DTYPES[dtype])
    k[0, 5] = float("nan")
    k[1, 100] = -float("nan")  # a negative NaN: x86 keeps its sign, the GPU does not
    k[2, :64] = float("nan")   # a quant block of NaNs only
    k[3, 70], k[3, 71] = float("nan"), float("inf")  # a NaN beside an inf: amax inf
    kv = torch.full((1, 16, 136), 0xA5, dtype=torch.uint8)
    ng.indexer_k_quant_and_cache(k, kv, torch.tensor([3, 7, 9, 11]), 64, fmt)
    vals = kv[0].view(-1)[:16 * 128].view(16, 128)
    scales = kv[0].view(-1)[16 * 128:].view(16, 2, 4).view(torch.float32).view(16, 2)
    nans = torch.isnan(k.float())
    ref = torch.full_like(kv, 0xA5)  # the same rows with their NaNs zeroed
    ng.indexer_k_quant_and_cache(torch.where(nans, torch.zeros_like(k), k), ref, torch.tensor([3, 7, 9, 11]), 64, fmt)
    ref_vals = ref[0].view(-1)[:16 * 128].view(16, 128)
    ref_scales = ref[0].view(-1)[16 * 128:].view(16, 2, 4).view(torch.float32).view(16, 2)
    rows = torch.tensor([3, 7, 9, 11])
    assert not bool(torch.isnan(scales[rows]).any())
    assert torch.equal(scales[rows], ref_scales[rows])
    assert torch.equal(vals[rows][nans], torch.full((int(nans.sum()),), 0x7F, dtype=torch.uint8))
    assert torch.equal(vals[rows][~nans], ref_vals[rows][~nans])
    want_floor = 1e-4 / 448 if fmt == "fp8_e4m3" else 2.0 ** -22  # the block of NaNs: amax 0
    assert scales[9, 0].item() == torch.tensor(want_floor, dtype=torch.float32).item()
    assert scales[11, 1].item() == float("inf")
    assert bool((vals[3, 64:] != 0x7F).any()) and bool((vals[7, :64] != 0x7F).any())


def test_largest_values_saturate_nowhere_and_match_an_independent_reference():
    """f32 k at FLT_MAX and fp16's largest: the scale keeps every quotient <= 448, so no code
    saturates and the bytes are the reference's."""
    k = torch.randn(2, 128, generator=torch.Generator().manual_seed(11))
    k[0, :64] = 3.4028234e38
    k[0, 64:] = -3.4028234e38
    k[1, 7] = 65504.0
    kv = torch.zeros(1, 16, 136, dtype=torch.uint8)
    ng.indexer_k_quant_and_cache(k, kv, torch.tensor([0, 1]), 64, "fp8_e4m3")
    vals = kv[0].view(-1)[:16 * 128].view(16, 128)
    assert bool((vals[0, :64] == 0x7E).all()) and bool((vals[0, 64:] == 0xFE).all())
    scale = (k[1, :64].abs().max() / torch.tensor(448.0))
    assert vals[1, 7].item() == torch_fp8(np.array([65504.0 / scale.item()], dtype=np.float32))[0] == 0x7E
