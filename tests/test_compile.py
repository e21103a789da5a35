"""NVRTC compilation without a GPU: every kernel module for every CI arch, target choice,
and the errors a user sees."""
import pytest

from nvrtc_gather import compiler, kernels
from nvrtc_gather.errors import CompileError, MissingDependencyError

CI_ARCHS = (80, 86, 89, 90, 100, 120)


@pytest.mark.parametrize("cc", CI_ARCHS)
@pytest.mark.parametrize("module", kernels.ALL_MODULES, ids=lambda m: m.name)
def test_every_module_compiles_to_a_cubin(module, cc):
    code = compiler.compile_module(module, compiler.Target(f"sm_{cc}"))
    assert code.image[:4] == b"\x7fELF"  # a cubin is an ELF image
    for name in module.kernels:
        assert name.encode() in code.image


def test_ptx_for_a_gpu_newer_than_nvrtc():
    newest = max(compiler.supported_archs())
    target = compiler.pick_target(newest + 50)
    assert target == compiler.Target(f"compute_{newest}") and target.is_ptx
    code = compiler.compile_module(kernels.GATHER, target)
    assert b".entry gather_indexer_k_v16" in code.image


def test_pick_target_rules():
    known = (75, 80, 86, 89, 90, 100, 120)
    assert compiler.pick_target(90, known).arch == "sm_90"
    assert compiler.pick_target(87, known).arch == "sm_86"   # same major, older minor: cubin runs
    assert compiler.pick_target(130, known).arch == "compute_120"
    with pytest.raises(MissingDependencyError, match="cannot compile for compute capability 6.0"):
        compiler.pick_target(60, known)


def test_compile_error_carries_the_log(monkeypatch):
    from nvrtc_gather import sources
    broken = kernels.KernelModule("broken", "broken.cu", ("k",))
    real = sources.read_source
    monkeypatch.setattr(sources, "read_source",
                        lambda n: 'extern "C" __global__ void k() { undeclared_thing(); }' if n == "broken.cu" else real(n))
    with pytest.raises(CompileError, match="undeclared_thing") as info:
        compiler.compile_module(broken, compiler.Target("sm_90"))
    assert "identifier" in info.value.log and "sm_90" in str(info.value)


def test_missing_nvrtc_says_what_to_install(monkeypatch):
    class DynamicLibNotFoundError(RuntimeError):
        pass

    def boom(*a):
        raise DynamicLibNotFoundError("libnvrtc.so not found")

    from cuda.bindings import nvrtc
    monkeypatch.setattr(nvrtc, "nvrtcCreateProgram", boom)
    with pytest.raises(MissingDependencyError, match="pip install cuda-bindings nvidia-cuda-nvrtc"):
        compiler.compile_module(kernels.GATHER, compiler.Target("sm_90"))


def test_no_gpu_driver_says_what_to_install():
    from nvrtc_gather import driver
    try:
        driver.init()
    except MissingDependencyError as exc:
        assert "install the NVIDIA driver" in str(exc)
    else:
        pytest.skip("a CUDA driver is present on this machine")


def test_ops_launch_only_entry_points_their_module_declares():
    from nvrtc_gather import gather, quant_cache
    assert set(gather.KERNEL_NAMES.values()) == set(kernels.GATHER.kernels)
    assert set(quant_cache.KERNEL_NAMES.values()) == set(kernels.QUANT.kernels)
