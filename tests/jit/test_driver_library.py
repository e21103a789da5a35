"""jit/driver.py against a stand-in driver library built from C (tests/helpers/fake_libcuda.c):
every entry point is bound by name with the argument types, order and out-parameters the
real libcuda.so.1 has, the errors say what to do, and a kernel loaded and launched by
runtime.py reaches the library with its grid, block, stream and parameters. No GPU needed."""
import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.nvidia_files import nvidia_file
from nvrtc_gather.errors import CudaError, MissingDependencyError
from nvrtc_gather.jit import build, driver, runtime
from nvrtc_gather.kernels import gather as gather_kernels

SOURCE = Path(__file__).parents[1] / "helpers" / "fake_libcuda.c"


def _build(tmp: Path, name: str, source: str) -> str:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in driver library")
    src, lib = tmp / f"{name}.c", tmp / f"{name}.so"
    src.write_text(source)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", str(src), "-o", str(lib)], check=True, capture_output=True)
    return str(lib)


@pytest.fixture(scope="module")
def fake_library(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("libcuda"), "fake_libcuda", SOURCE.read_text())


def _forget(monkeypatch):
    """What a fresh process knows of the driver: nothing."""
    for cached in (driver._library, driver._device, driver.capability, driver.sm_count, driver.primary_context,
                   driver.raw):
        cached.cache_clear()
    monkeypatch.setattr(driver, "_initialized", False)


@pytest.fixture
def lib(fake_library, monkeypatch, tmp_path):
    _forget(monkeypatch)
    monkeypatch.setattr(driver, "LIBRARY", fake_library)
    monkeypatch.setenv("NVRTC_GATHER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(runtime, "_libraries", {})
    monkeypatch.setattr(runtime, "_loaded", {})
    fake = ctypes.CDLL(fake_library)  # the same loaded library: its fake_* functions read its state
    fake.fake_set_init_result(0)
    fake.fake_set_current(None)
    for name in ("fake_last_stream", "fake_last_function", "fake_last_params"):
        getattr(fake, name).restype = ctypes.c_void_p
    fake.fake_kernel_name.restype, fake.fake_kernel_name.argtypes = ctypes.c_char_p, (ctypes.c_void_p,)
    fake.fake_last_grid.restype = fake.fake_last_block.restype = ctypes.c_uint
    yield fake
    _forget(monkeypatch)


def test_device_queries_read_the_drivers_out_parameters(lib):
    assert driver.driver_version() == 12080 and driver.device_count() == 2
    assert (driver.capability(0), driver.capability(1)) == (90, 80)
    assert (driver.sm_count(0), driver.sm_count(1)) == (132, 108)
    assert driver.device_name(1) == "Fake GPU 1"
    assert (driver.primary_context(0), driver.primary_context(1)) == (0x1000, 0x1001)
    assert driver.stream_is_capturing(0xCA97) and not driver.stream_is_capturing(0)


def test_errors_carry_the_drivers_name_and_what_to_do(lib):
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_DEVICE"):
        driver.capability(2)
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_IMAGE.*rejected the kernel image"):
        driver.load_library(b"not a kernel image")
    with pytest.raises(CudaError, match=r"cuLibraryGetKernel\(missing\).*CUDA_ERROR_NOT_FOUND"):
        driver.get_function(driver.load_library(b"// PTX"), "missing")
    assert driver.error_name(201) == "CUDA_ERROR_INVALID_CONTEXT" and driver.error_name(12345) == "CUresult"


@pytest.mark.parametrize("code, error, words", [(100, MissingDependencyError, "install the NVIDIA driver"),
                                                (34, CudaError, "toolkit's stub")])
def test_cu_init_failures_say_what_to_install(lib, code, error, words):
    lib.fake_set_init_result(code)
    with pytest.raises(error, match=words):
        driver.device_count()


def test_no_driver_library_or_one_too_old_says_what_to_install(lib, monkeypatch, tmp_path):
    monkeypatch.setattr(driver, "LIBRARY", str(tmp_path / "libcuda.so.1"))
    with pytest.raises(MissingDependencyError, match="install the NVIDIA driver"):
        driver.init()
    old = _build(tmp_path, "old_libcuda", "int cuInit(unsigned f) { return 0; }\n")
    monkeypatch.setattr(driver, "LIBRARY", old)
    with pytest.raises(MissingDependencyError, match="has no cuDriverGetVersion: it is older than CUDA 12.0"):
        driver.init()


def test_a_loaded_kernel_launches_with_its_grid_block_stream_and_parameters(lib):
    module = gather_kernels.MODULES[16]
    on0 = runtime.load(module, 0)  # NVRTC compiles for sm_90; the library loads it in context 0x1000
    assert lib.fake_ctx_depth() == 0  # fetched with the primary context pushed, then popped
    entry = module.kernels[0]
    assert lib.fake_kernel_name(on0.functions[entry]) == entry.encode()
    fixed = {n: 0 for n in gather_kernels.PARAMS.names[5:] if n != "error"}
    go = on0.launcher(entry, 3, gather_kernels.PARAMS.image(**fixed), lambda device: 0x5100)
    pointers = (0x10, 0x20, 0x30, 0x40, 0x50)

    lib.fake_set_current(0x1000)  # device 0's context current: launched as is
    go(pointers)
    assert (lib.fake_launches(), lib.fake_last_grid(), lib.fake_last_block()) == (1, 3, gather_kernels.THREADS)
    assert (lib.fake_last_stream(), lib.fake_last_function()) == (0x5100, on0.functions[entry])
    assert ctypes.string_at(lib.fake_last_params(), 40) == b"".join(p.to_bytes(8, "little") for p in pointers)

    lib.fake_set_current(None)  # no context current: refused, then launched with 0x1000 pushed
    go(pointers)
    assert (lib.fake_launches(), lib.fake_ctx_depth()) == (2, 0)


def test_an_image_from_the_disk_cache_loads_as_a_fresh_compile_does(lib, monkeypatch):
    module = gather_kernels.MODULES[16]
    compiles = build.stats["compiles"]
    runtime.load(module, 0)
    monkeypatch.setattr(runtime, "_libraries", {})  # a fresh process: the image comes from the disk cache
    monkeypatch.setattr(runtime, "_loaded", {})
    again = runtime.load(module, 0)
    assert build.stats["compiles"] == compiles + 1 and set(again.functions) == set(module.kernels)
    assert runtime.load(module, 1).functions  # device 1, an sm_80: its own image, compiled


def _kind(c_type) -> str:
    return {ctypes.c_int: "int", ctypes.c_uint: "uint"}.get(c_type, "ptr")


def _declared_kind(param: str) -> str:
    """A C parameter of cuda-bindings' cydriver.pxd as its ABI kind: pointers and the opaque
    handles are pointers; CUdevice, the enums and int are int."""
    handles = ("CUlibrary ", "CUcontext ", "CUkernel ", "CUfunction ", "CUstream ")
    if "*" in param or param.startswith(handles):
        return "ptr"
    return "uint" if param.startswith("unsigned int") else "int"


def test_every_bound_entry_point_has_the_drivers_declared_signature():
    """Our ctypes argument types against the C prototypes NVIDIA ships with cuda-bindings
    (cydriver.pxd), and the attribute and result codes against its enums."""
    import cuda.bindings
    from cuda.bindings import driver as bindings  # its enums only: no driver call is made
    pxd = (Path(cuda.bindings.__file__).parent / "cydriver.pxd").read_text()
    for name, (_symbol, *argtypes) in driver._SIGNATURES.items():
        proto = re.search(rf"^\s*cdef CUresult {name}\((.*?)\)", pxd, re.M)
        assert proto, f"{name} is not declared in cydriver.pxd"
        assert [_kind(t) for t in argtypes] == [_declared_kind(p.strip()) for p in proto[1].split(",")], name
    a = bindings.CUdevice_attribute
    assert (driver._MULTIPROCESSOR_COUNT, driver._CC_MAJOR, driver._CC_MINOR) == (
        int(a.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), int(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
        int(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
    for code in driver._HINTS:
        assert bindings.CUresult(code).name.startswith("CUDA_ERROR_"), code


def test_every_entry_point_is_bound_by_the_name_cuda_h_gives_it():
    """cuda.h maps some API names to versioned symbols (``#define cuCtxPushCurrent
    cuCtxPushCurrent_v2``); libcuda keeps the unversioned ones for old binaries, with the old
    meaning, so a wrong name would still bind. Each symbol we bind is the one cuda.h (NVIDIA's
    nvidia-cuda-runtime wheel, of the test extra) compiles a call to, the default stream's form."""
    header = nvidia_file("*/include/cuda.h")
    if header is None:
        pytest.skip("cuda.h not installed (pip install nvidia-cuda-runtime: the test extra has it)")
    text = header.read_text(errors="replace")
    for name, (symbol, *_args) in driver._SIGNATURES.items():
        assert re.search(rf"CUresult CUDAAPI {name}\(", text), f"{name} is not declared in {header}"
        defined = re.search(rf"^\s*#\s*define\s+{name}\s+(\w+)\s*$", text, re.M)
        assert symbol == (defined[1] if defined else name), f"{name}: cuda.h calls {defined and defined[1]}, we bind {symbol}"
