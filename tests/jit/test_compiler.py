"""NVRTC compilation without a GPU: every kernel module for every CI arch, target choice,
and the errors a user sees."""
import dataclasses
import pytest
import torch

from nvrtc_gather.jit import compiler, spec
from nvrtc_gather.errors import CompileError, MissingDependencyError
from nvrtc_gather.kernels import gather as gather_kernels, indexer_k_quant as quant_kernels
from nvrtc_gather import kernels

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
    code = compiler.compile_module(gather_kernels.MODULES[16], target)
    assert b".entry gather_indexer_k_v16" in code.image


def test_pick_target_rules():
    known = (75, 80, 86, 89, 90, 100, 120)
    assert compiler.pick_target(90, known).arch == "sm_90"
    assert compiler.pick_target(87, known).arch == "sm_86"   # same major, older minor: cubin runs
    assert compiler.pick_target(130, known).arch == "compute_120"
    with pytest.raises(MissingDependencyError, match="cannot compile for compute capability 6.0"):
        compiler.pick_target(60, known)


def test_compile_error_carries_the_log(monkeypatch):
    from nvrtc_gather.jit import sources
    broken = dataclasses.replace(gather_kernels.MODULES[16], name="broken", source="broken.cu", entries=(spec.Entry("k"),))
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
    with pytest.raises(MissingDependencyError, match="pip install .nvidia-cuda-nvrtc==13.\\*. \\(NVRTC for the installed cuda-bindings 13"):
        compiler.compile_module(gather_kernels.MODULES[16], compiler.Target("sm_90"))


def test_no_gpu_driver_says_what_to_install():
    from nvrtc_gather.jit import driver
    try:
        driver.init()
    except MissingDependencyError as exc:
        assert "install the NVIDIA driver" in str(exc)
    else:
        pytest.skip("a CUDA driver is present on this machine")


@pytest.mark.parametrize("module", kernels.ALL_MODULES, ids=lambda m: m.name)
def test_every_entry_point_of_the_spec_is_in_the_compiled_module(module):
    image = compiler.compile_module(module, compiler.Target("sm_90")).image
    for name in module.kernels:
        assert b"\0" + name.encode() + b"\0" in image, name


def test_ops_choose_only_entry_points_of_their_modules():
    from nvrtc_gather.ops import gather, indexer_k_quant
    base = gather.GatherPlan(**{f: 1 for f in gather.GatherPlan._fields})._replace(num_tokens=1000, head_dim=128)
    chosen = {(p.vec, gather.launch_config(p).entry) for p in
              (base._replace(vec=vec, tokens_per_cta=tpc) for vec in (16, 8, 4) for tpc in (8, 128, 256))}
    assert chosen == {(vec, e) for vec, m in gather_kernels.MODULES.items() for e in m.kernels}
    qbase = indexer_k_quant.QuantPlan(**{f: 1 for f in indexer_k_quant.QuantPlan._fields})._replace(
        head_dim=128, quant_block_size=128, tokens_per_pass=16, sm_count=132)
    qplans = [qbase._replace(k_type=t, vec=vec, num_tokens=n) for t in quant_kernels.K_TYPES
              for vec in quant_kernels.VECTOR_WIDTHS for n in (10, 1 << 20)]  # small and large calls
    qchosen = {((p.k_type, p.vec, indexer_k_quant.call_shape(p)), indexer_k_quant.launch_config(p).entry)
               for p in qplans}
    assert qchosen == {(key, e) for key, m in quant_kernels.MODULES.items() for e in m.kernels}


# A child process: compile GATHER's cubin and PTX in the working directory argv[1], write them to argv[2].
_COMPILE_IN_CWD = ("import os, sys\nos.chdir(sys.argv[1])\nfrom nvrtc_gather.jit import compiler\nfrom nvrtc_gather.kernels import gather as gather_kernels\n"
                   "images = [compiler.compile_module(gather_kernels.MODULES[16], compiler.Target(a)).image "
                   "for a in ('sm_90', 'compute_90')]\n"
                   "open(sys.argv[2], 'wb').write(images[0]); open(sys.argv[2] + '.ptx', 'wb').write(images[1])\n")


def test_image_does_not_depend_on_the_working_directory(tmp_path):
    """-lineinfo records source paths; none may come from the cwd: one key, one image, no path leaked."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]  # the checkout
    cwds = [tmp_path / "first_cwd_d1f0a7", tmp_path / "elsewhere" / "second_cwd_9c2e4b"]
    procs = []
    for i, cwd in enumerate(cwds):
        cwd.mkdir(parents=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
        procs.append(subprocess.Popen([sys.executable, "-c", _COMPILE_IN_CWD, str(cwd), str(tmp_path / f"img{i}")],
                                      env=env, stderr=subprocess.PIPE, text=True))
    for p in procs:
        assert p.wait(300) == 0, p.stderr.read()
    for suffix in ("", ".ptx"):
        images = [(tmp_path / f"img{i}{suffix}").read_bytes() for i in range(2)]
        assert images[0] == images[1]
        for image in images:
            for cwd in cwds:
                assert cwd.name.encode() not in image and str(tmp_path).encode() not in image
            assert compiler.SOURCE_ROOT.encode() in image  # the fixed place NVRTC is told the sources are
