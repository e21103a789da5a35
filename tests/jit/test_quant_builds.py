"""The quant source's two fp8 encoders, without a GPU: the hardware e4m3x2 conversion is in
the sm_89+ code of the op's build and nowhere else (the integer encoder serves sm_80/86, and
the test build helpers.builds.QUANT_SOFT_FP8 forces it everywhere, so GPU tests run it)."""
from helpers.builds import QUANT_SOFT_FP8
from nvrtc_gather.jit import compiler
from nvrtc_gather.kernels import indexer_k_quant as quant_kernels

CVT = b"cvt.rn.satfinite.e4m3x2.f32"


def test_hardware_fp8_conversion_only_where_it_exists():
    """PTX (readable, unlike a cubin): the e4m3x2 instruction for compute_89+, not for
    compute_80 (no such instruction) nor in the NG_SOFT_FP8 build."""
    ptx = {(m.name, a): compiler.compile_module(m, compiler.Target(f"compute_{a}")).image
           for m, a in ((quant_kernels.MODULES["bf16", 16, ""], 90), (quant_kernels.MODULES["bf16", 16, ""], 80), (QUANT_SOFT_FP8, 90))}
    assert CVT in ptx[quant_kernels.MODULES["bf16", 16, ""].name, 90]
    assert CVT not in ptx[quant_kernels.MODULES["bf16", 16, ""].name, 80]
    assert CVT not in ptx["quant_cache_soft", 90]
