"""registry.functions and the launcher's context handling against a fake CUDA driver, so
the load path runs in CI without a GPU: NVRTC and the disk cache are real."""
import ctypes
import struct

import pytest

from nvrtc_gather import cache, driver, kernels, launcher, registry
from nvrtc_gather.errors import CudaError


class FakeDriver:
    """Records loads; refuses images listed in ``bad`` the way the real driver does (the
    load itself succeeds, fetching a kernel fails)."""

    def __init__(self):
        self.loaded, self.bad, self.current, self.pushed = [], set(), 0, []
        self.launches, self.fetch_ctx = [], []
        self.grid, self.params = None, b""  # of the last launch
        self.on_launch = None  # what the "kernel" does

    def load_library(self, image):
        self.loaded.append(image)
        return len(self.loaded)

    def unload_library(self, lib):
        pass

    def get_function(self, lib, name):
        self.fetch_ctx.append(self.pushed[-1] if self.pushed else self.current)
        if self.loaded[lib - 1] in self.bad:
            raise CudaError("cuKernelGetFunction", 209, "CUDA_ERROR_NO_BINARY_FOR_GPU")
        return 1000 * lib + len(name)

    # the raw entry points the launcher and in_primary_context call
    def ctx_get_current(self, ref):
        ref._obj.value = self.current or None
        return 0

    def ctx_push(self, ctx):
        self.pushed.append(ctx)
        return 0

    def ctx_pop(self, ref):
        self.pushed.pop()
        return 0

    def launch_ex(self, cfg, fn, params, extra):
        self.launches.append((self.pushed[-1] if self.pushed else self.current, fn))
        self.grid = driver.LaunchConfig.from_address(cfg).gridDimX
        # params: the address of a void*[1] pointing at the packed struct; keep its head
        self.params = ctypes.string_at(ctypes.c_void_p.from_address(params).value, 256)
        if self.on_launch:
            self.on_launch()
        return 0


@pytest.fixture
def fake(monkeypatch, tmp_path):
    f = FakeDriver()
    monkeypatch.setenv("NVRTC_GATHER_CACHE_DIR", str(tmp_path))
    for name in ("load_library", "unload_library", "get_function"):
        monkeypatch.setattr(driver, name, getattr(f, name))
    monkeypatch.setattr(driver, "capability", lambda device: 90)
    monkeypatch.setattr(driver, "primary_context", lambda device: 7 + device)
    monkeypatch.setattr(driver, "raw", lambda: f)
    monkeypatch.setattr(registry, "_libraries", {})
    monkeypatch.setattr(registry, "_functions", {})
    return f


def _forget_loaded(monkeypatch):
    """What a fresh process knows: nothing in memory, the disk cache as it is."""
    monkeypatch.setattr(registry, "_libraries", {})
    monkeypatch.setattr(registry, "_functions", {})


def test_cold_then_warm_reads_the_cache_entry_once(fake, monkeypatch):
    before = dict(registry.stats)
    fns = registry.functions(kernels.GATHER, 0)
    assert set(fns) == set(kernels.GATHER.kernels) and len(fake.loaded) == 1
    assert registry.stats["compiles"] == before["compiles"] + 1

    _forget_loaded(monkeypatch)
    reads = []
    real_get = cache.DiskCache.get
    monkeypatch.setattr(cache.DiskCache, "get", lambda self, n, k: reads.append(n) or real_get(self, n, k))
    compiles = registry.stats["compiles"]
    registry.functions(kernels.GATHER, 0)
    assert registry.stats["compiles"] == compiles
    assert reads == [registry.entry_name(kernels.GATHER, registry.compiler.Target("sm_90"))]
    assert fake.loaded[1] == fake.loaded[0]


def test_cached_image_the_driver_refuses_is_recompiled_and_replaced(fake, monkeypatch):
    registry.functions(kernels.GATHER, 0)
    target = registry.compiler.Target("sm_90")
    key = registry.cache_key(kernels.GATHER, target)
    disk = cache.current()
    good = disk.get(registry.entry_name(kernels.GATHER, target), key)
    # An intact entry (right key, right checksum) holding code the driver will not take.
    disk.put(registry.entry_name(kernels.GATHER, target), key, b"\x7fELF not really a cubin")
    fake.bad.add(b"\x7fELF not really a cubin")
    _forget_loaded(monkeypatch)
    compiles = registry.stats["compiles"]
    fns = registry.functions(kernels.GATHER, 0)
    assert registry.stats["compiles"] == compiles + 1 and set(fns) == set(kernels.GATHER.kernels)
    assert disk.get(registry.entry_name(kernels.GATHER, target), key) == good


def test_launch_pushes_the_primary_context_only_when_another_is_current(fake):
    layout = struct.Struct("<Q")
    fake.current = 7  # device 0's primary context is current
    launcher.launch(0, 42, 3, 0, layout, (5,))
    fake.current = 7  # tensors on device 1 while device 0 is current
    launcher.launch(1, 43, 3, 0, layout, (5,))
    fake.current = 0  # a thread where no context is current
    launcher.launch(0, 44, 3, 0, layout, (5,))
    assert fake.launches == [(7, 42), (8, 43), (7, 44)]
    assert fake.pushed == []  # every push popped


def test_kernels_are_fetched_in_the_devices_primary_context(fake):
    fake.current = 7  # device 0's context is current; the kernels are wanted on device 1
    registry.functions(kernels.GATHER, 1)
    assert fake.fetch_ctx == [8] * len(kernels.GATHER.kernels) and fake.pushed == []


def test_both_ops_dispatch_through_registry_and_launcher(fake, monkeypatch):
    """The ops' CUDA branch (kernel choice, grid, parameter packing, launch, debug-mode error
    buffer) with the plan of CPU tensors relabelled as device 0 and the fake driver underneath."""
    import random

    import torch

    from nvrtc_gather import gather, quant_cache
    from reference import make_gather_case, make_quant_case

    fake.current = 7
    c = make_gather_case(random.Random(1), block_size=16, head_dim=128, quant_block_size=64, batch=5,
                         strided=False)
    plan = gather.plan_gather(*c.args())._replace(device=0, tokens_per_cta=8)
    monkeypatch.setattr(gather, "plan_gather", lambda *a: plan)
    monkeypatch.setattr(gather, "current_stream", lambda device: 0)
    gather.cp_gather_indexer_k_quant_cache(*c.args())
    name, grid, values = gather.launch_config(plan)
    assert fake.launches[-1] == (7, registry.functions(kernels.GATHER, 0)[name])
    assert (fake.grid, fake.params[:gather.PARAMS.size]) == (grid, gather.PARAMS.pack(*values))

    q = make_quant_case(random.Random(2), head_dim=128, quant_block_size=64, block_size=16,
                        dtype=torch.bfloat16, scale_fmt="ue8m0", num_tokens=20)
    qplan = quant_cache.plan_quant(*q.args())._replace(device=0)
    monkeypatch.setattr(quant_cache, "plan_quant", lambda *a: qplan)
    monkeypatch.setattr(quant_cache, "current_stream", lambda device: 0)
    quant_cache.indexer_k_quant_and_cache(*q.args())
    name, grid, values = quant_cache.launch_config(qplan, torch.bfloat16)
    assert fake.launches[-1] == (7, registry.functions(kernels.QUANT, 0)[name])
    assert (fake.grid, fake.params[:quant_cache.PARAMS.size]) == (grid, quant_cache.PARAMS.pack(*values))

    # Debug mode: the error buffer's address goes into the struct, and an error the kernel
    # records there is raised.
    from nvrtc_gather import debug_check
    err = torch.zeros(4, dtype=torch.int64)
    monkeypatch.setenv("NVRTC_GATHER_DEBUG", "1")
    monkeypatch.setattr(debug_check, "error_buffer", lambda device: err)
    fake.on_launch = lambda: err.copy_(torch.tensor([3, 21, 2, 10 ** 6]))
    with pytest.raises(ValueError, match="row 21 .request 2. maps to physical block 1000000"):
        gather.cp_gather_indexer_k_quant_cache(*c.args())
    assert fake.params[:gather.PARAMS.size] == gather.PARAMS.pack(*gather.launch_config(plan, err.data_ptr())[2])
    err.zero_()
    fake.on_launch = lambda: err.copy_(torch.tensor([7, 5, 99999, 640]))
    with pytest.raises(ValueError, match="slot_mapping: entry 5 = 99999"):
        quant_cache.indexer_k_quant_and_cache(*q.args())
    assert fake.params[:quant_cache.PARAMS.size] == quant_cache.PARAMS.pack(
        *quant_cache.launch_config(qplan, torch.bfloat16, err.data_ptr())[2])
    err.zero_()
    fake.on_launch = None
    gather.cp_gather_indexer_k_quant_cache(*c.args())  # nothing recorded: no error
