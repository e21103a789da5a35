"""The quant module's builds without a GPU: the benchmark-only ones
(kernels.BENCH_QUANT_VARIANTS) compile for sm_80 and sm_90; the hardware fp8 conversion is in
the op's sm_89+ code and nowhere else; and the kernels of each NG_QUNROLL / NG_QWIDE build,
run by the host emulator (tests/cuda_host_emu.cpp, which always takes the integer fp8 path)
with the grid that build needs, are bit-exact against the torch path, on random cases and on
values that hit every rounding case of e4m3 exactly."""
import random

import pytest
import torch

from nvrtc_gather import compiler, kernels, quant_cache
from nvrtc_gather.bench_quant import variant_unroll
from nvrtc_gather.quant_torch import quant_torch
from host_emu import emulator
from reference import make_quant_case

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
CVT = b"cvt.rn.satfinite.e4m3x2.f32"


@pytest.mark.parametrize("cc", (80, 90))
@pytest.mark.parametrize("module", kernels.BENCH_QUANT_VARIANTS, ids=lambda m: m.name)
def test_benchmark_builds_compile(module, cc):
    code = compiler.compile_module(module, compiler.Target(f"sm_{cc}"))
    assert code.image[:4] == b"\x7fELF"
    for name in module.kernels:
        assert name.encode() in code.image


def test_hardware_fp8_conversion_only_where_it_exists():
    """PTX (readable, unlike a cubin): the e4m3x2 instruction for compute_89+, not for
    compute_80 (no such instruction) nor in the NG_SOFT_FP8 build."""
    ptx = {(m.name, a): compiler.compile_module(m, compiler.Target(f"compute_{a}")).image
           for m, a in ((kernels.QUANT, 90), (kernels.QUANT, 80), (kernels.QUANT_SOFT_FP8, 90))}
    assert CVT in ptx["quant_cache", 90]
    assert CVT not in ptx["quant_cache", 80]
    assert CVT not in ptx["quant_cache_soft", 90]


def test_benchmark_builds_have_distinct_names():
    names = [m.name for m in kernels.ALL_MODULES + kernels.BENCH_QUANT_VARIANTS]
    assert len(set(names)) == len(names)
    assert all(m.source == kernels.QUANT.source and m.kernels == kernels.QUANT.kernels
               for m in kernels.BENCH_QUANT_VARIANTS)
    assert variant_unroll(kernels.QUANT) == quant_cache.UNROLL


# --- emulated -----------------------------------------------------------------------------

def _emulator(tmp_path_factory, defines):
    return emulator(tmp_path_factory, defines)


def _run(dll, unroll, k, kv, slots, qbs, fmt):
    import ctypes
    plan = quant_cache.plan_quant(k, kv, slots, qbs, fmt)
    if not plan.num_tokens:
        return
    name, grid, values = quant_cache.launch_config(plan, k.dtype, unroll=unroll)
    fn = ctypes.cast(getattr(dll, name), ctypes.c_void_p)
    assert dll.emu_launch(fn, quant_cache.PARAMS.pack(*values), grid) == quant_cache.PARAMS.size
    assert dll.emu_faults() == 0, "misaligned vector load or store"


def _check(dll, unroll, case):
    want = case.kv_store.clone()
    kv_want = want.as_strided(*case.kv_view)
    quant_torch(quant_cache.plan_quant(case.k, kv_want, case.slot_mapping, case.quant_block_size, case.scale_fmt),
                case.k, kv_want, case.slot_mapping)
    _run(dll, unroll, *case.args())
    assert torch.equal(case.kv_store, want), case.desc + f" ({int((case.kv_store != want).sum())} bytes differ)"


# Both lane widths where a build's NG_QUNROLL allows them (two vectors per lane need a
# power-of-two lane count and quant blocks of an even number of vectors), shuffles only and
# shared memory (more than 32 lanes per quant block) with each.
SHAPES = [("bf16", 128, 128), ("bf16", 128, 32), ("bf16", 512, 512), ("bf16", 1024, 1024), ("bf16", 192, 96),
          ("f16", 128, 64), ("f32", 128, 128), ("f32", 1024, 512), ("f32", 128, 2)]


@pytest.mark.parametrize("module", [kernels.QUANT] + [m for m in kernels.BENCH_QUANT_VARIANTS
                                                      if m is not kernels.QUANT_SOFT_FP8], ids=lambda m: m.name)
def test_emulated_builds_match_torch(tmp_path_factory, module):
    defines = tuple(o for o in module.options if o.startswith("-D"))
    dll = _emulator(tmp_path_factory, defines)
    rng = random.Random(module.name)
    for dt, hd, qbs in SHAPES:
        for fmt in ("ue8m0", "fp8_e4m3"):
            for bs, tokens, row_pad in ((1, 19, 0), (16, 33, 0), (3, 5, 4)):
                _check(dll, variant_unroll(module), make_quant_case(
                    rng, head_dim=hd, quant_block_size=qbs, block_size=bs, dtype=DTYPES[dt], scale_fmt=fmt,
                    num_tokens=tokens, extra_rows=3, k_row_pad=row_pad, block_pad=rng.choice([0, 4, 16])))


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("fmt", ["ue8m0", "fp8_e4m3"])
def test_emulated_rounding_ties_zeros_and_subnormals(tmp_path_factory, dt, fmt):
    """The values of test_quant_gpu.py's tie test, through the default build's kernels."""
    from test_quant_gpu import _special_k
    dll = _emulator(tmp_path_factory, ())
    k = _special_k(DTYPES[dt])
    slots = torch.randperm(4 * 16, generator=torch.Generator().manual_seed(1))[:k.shape[0]]
    kv = torch.randint(0, 256, (4, 16, 128 + 4 * 4), dtype=torch.uint8)
    want = kv.clone()
    quant_torch(quant_cache.plan_quant(k, want, slots, 32, fmt), k, want, slots)
    _run(dll, quant_cache.UNROLL, k, kv, slots, 32, fmt)
    assert torch.equal(kv, want)
