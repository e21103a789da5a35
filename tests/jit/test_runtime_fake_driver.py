"""runtime.load, the kernel handle's launch and its context handling against a fake CUDA
driver, so the load and launch paths run in CI without a GPU: NVRTC and the disk cache are real."""
import ctypes

import pytest

from nvrtc_gather.errors import CudaError
from nvrtc_gather.jit import build, cubin_cache, driver, runtime
from nvrtc_gather.kernels import gather as gather_kernels, indexer_k_quant as quant_kernels


class FakeDriver:
    """Records loads; refuses images listed in ``bad`` the way the real driver does (the
    load itself succeeds, fetching a kernel fails)."""

    def __init__(self):
        self.loaded, self.bad, self.current, self.pushed = [], set(), 0, []
        self.launches, self.fetch_ctx = [], []
        self.function_ctx = {}  # CUfunction -> the context it belongs to
        self.refused, self.ctx_queries = [], 0
        self.grid, self.block, self.params = None, None, b""  # of the last launch
        self.on_launch = None  # what the "kernel" does

    def load_library(self, image):
        self.loaded.append(image)
        return len(self.loaded)

    def unload_library(self, lib):
        pass

    def get_function(self, lib, name):
        ctx = self.pushed[-1] if self.pushed else self.current
        self.fetch_ctx.append(ctx)
        if self.loaded[lib - 1] in self.bad:
            raise CudaError("cuKernelGetFunction", 209, "CUDA_ERROR_NO_BINARY_FOR_GPU")
        fn = 100000 * ctx + 1000 * lib + len(name)  # one CUfunction per context, as the driver's
        self.function_ctx[fn] = ctx
        return fn

    # the raw entry points the launcher and in_primary_context call
    def ctx_get_current(self, ref):
        self.ctx_queries += 1
        ref._obj.value = (self.pushed[-1] if self.pushed else self.current) or None
        return 0

    def ctx_push(self, ctx):
        self.pushed.append(ctx)
        return 0

    def ctx_pop(self, ref):
        self.pushed.pop()
        return 0

    def launch_ex(self, cfg, fn, params, extra):
        ctx = self.pushed[-1] if self.pushed else self.current
        if self.function_ctx.get(fn, ctx) != ctx:  # a function runs only in its own context
            self.refused.append((ctx, fn))
            return 201  # CUDA_ERROR_INVALID_CONTEXT
        self.launches.append((ctx, fn))
        self.grid = driver.LaunchConfig.from_address(cfg).gridDimX
        self.block = driver.LaunchConfig.from_address(cfg).blockDimX
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
    monkeypatch.setattr(runtime, "_libraries", {})
    monkeypatch.setattr(runtime, "_loaded", {})
    return f


def _forget_loaded(monkeypatch):
    """What a fresh process knows: nothing in memory, the disk cache as it is."""
    monkeypatch.setattr(runtime, "_libraries", {})
    monkeypatch.setattr(runtime, "_loaded", {})


def test_cold_then_warm_reads_the_cache_entry_once(fake, monkeypatch):
    before = dict(build.stats)
    fns = runtime.load(gather_kernels.MODULES[16], 0).functions
    assert set(fns) == set(gather_kernels.MODULES[16].kernels) and len(fake.loaded) == 1
    assert build.stats["compiles"] == before["compiles"] + 1

    _forget_loaded(monkeypatch)
    reads = []
    real_get = cubin_cache.DiskCache.get
    monkeypatch.setattr(cubin_cache.DiskCache, "get", lambda self, n, k: reads.append(n) or real_get(self, n, k))
    compiles = build.stats["compiles"]
    runtime.load(gather_kernels.MODULES[16], 0)
    assert build.stats["compiles"] == compiles
    assert reads == [build.cache_name(gather_kernels.MODULES[16], build.compiler.Target("sm_90"))]
    assert fake.loaded[1] == fake.loaded[0]


def test_cached_image_the_driver_refuses_is_recompiled_and_replaced(fake, monkeypatch):
    runtime.load(gather_kernels.MODULES[16], 0)
    target = build.compiler.Target("sm_90")
    key = build.cache_key(gather_kernels.MODULES[16], target)
    disk = cubin_cache.current()
    good = disk.get(build.cache_name(gather_kernels.MODULES[16], target), key)
    # An intact entry (right key, right checksum) holding code the driver will not take.
    disk.put(build.cache_name(gather_kernels.MODULES[16], target), key, b"\x7fELF not really a cubin")
    fake.bad.add(b"\x7fELF not really a cubin")
    _forget_loaded(monkeypatch)
    compiles = build.stats["compiles"]
    fns = runtime.load(gather_kernels.MODULES[16], 0).functions
    assert build.stats["compiles"] == compiles + 1 and set(fns) == set(gather_kernels.MODULES[16].kernels)
    assert disk.get(build.cache_name(gather_kernels.MODULES[16], target), key) == good


def test_launch_pushes_the_primary_context_only_when_another_is_current(fake):
    on0, on1 = runtime.load(gather_kernels.MODULES[16], 0), runtime.load(gather_kernels.MODULES[16], 1)
    entry = gather_kernels.MODULES[16].kernels[0]
    image = gather_kernels.PARAMS.image(**{n: 0 for n in gather_kernels.PARAMS.names if n != "error"})
    go0, go1 = on0.launcher(entry, 3, image, lambda device: 0), on1.launcher(entry, 3, image, lambda device: 0)
    fake.current, fake.ctx_queries = 7, 0  # device 0's primary context is current: launched, nothing asked
    go0(())
    assert (fake.launches, fake.refused, fake.ctx_queries) == ([(7, on0.functions[entry])], [], 0)
    fake.current = 7  # tensors on device 1 while device 0 is current
    go1(())
    fake.current = 0  # a thread where no context is current
    go0(())
    assert fake.launches == [(7, on0.functions[entry]), (8, on1.functions[entry]), (7, on0.functions[entry])]
    assert fake.refused == [(7, on1.functions[entry]), (0, on0.functions[entry])]  # each retried once, pushed
    assert fake.pushed == []  # every push popped


def test_a_launch_the_driver_refuses_in_its_own_context_raises(fake):
    on0 = runtime.load(gather_kernels.MODULES[16], 0)
    entry = gather_kernels.MODULES[16].kernels[0]
    fake.current, fake.ctx_queries = 7, 0
    fake.launch_ex = lambda *a: 701  # CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, say
    with pytest.raises(CudaError, match="cuLaunchKernelEx"):
        on0.launcher(entry, 3, gather_kernels.PARAMS.image(**{n: 0 for n in gather_kernels.PARAMS.names if n != "error"}),
                     lambda device: 0)(())
    assert fake.ctx_queries == 1 and fake.pushed == []  # not retried: the right context was current


def test_kernels_are_fetched_in_the_devices_primary_context(fake):
    fake.current = 7  # device 0's context is current; the kernels are wanted on device 1
    runtime.load(gather_kernels.MODULES[16], 1)
    assert fake.fetch_ctx == [8] * len(gather_kernels.MODULES[16].kernels) and fake.pushed == []


def test_both_ops_dispatch_through_the_kernel_handle(fake, monkeypatch):
    """The ops' CUDA branch (kernel choice, grid, parameter packing, launch, debug-mode error
    buffer) with the plan of CPU tensors relabelled as device 0 and the fake driver underneath."""
    import random

    import torch

    from nvrtc_gather.ops import gather
    from nvrtc_gather.ops import indexer_k_quant
    from helpers.reference import make_gather_case, make_quant_case

    fake.current = 7
    c = make_gather_case(random.Random(1), block_size=16, head_dim=128, quant_block_size=64, batch=5,
                         strided=False)
    plan = gather.plan_gather(*c.args())._replace(device=0, tokens_per_cta=8)
    monkeypatch.setattr(gather, "plan_gather", lambda *a: plan)
    monkeypatch.setattr(runtime, "current_stream", lambda device: 0)
    gather.cp_gather_indexer_k_quant_cache(*c.args())
    name, grid, fields = gather.launch_config(plan)
    params = gather_kernels.PARAMS
    assert fake.launches[-1] == (7, runtime.load(gather_kernels.MODULES[plan.vec], 0).functions[name])
    assert (fake.grid, fake.block, fake.params[:params.layout.size]) == (grid, gather_kernels.THREADS,
                                                                          params.pack(**fields, error=0))

    q = make_quant_case(random.Random(2), head_dim=128, quant_block_size=64, block_size=16,
                        dtype=torch.bfloat16, scale_fmt="ue8m0", num_tokens=20)
    qplan = indexer_k_quant.plan_quant(*q.args())._replace(device=0)
    monkeypatch.setattr(indexer_k_quant, "plan_quant", lambda *a: qplan)
    indexer_k_quant.indexer_k_quant_and_cache(*q.args())
    name, grid, qfields = indexer_k_quant.launch_config(qplan)
    qparams = quant_kernels.PARAMS
    assert fake.launches[-1] == (7, runtime.load(quant_kernels.MODULES["bf16", 16, indexer_k_quant.call_shape(qplan)], 0).functions[name])
    assert (fake.grid, fake.params[:qparams.layout.size]) == (grid, qparams.pack(**qfields, error=0))

    # Debug mode: the error buffer's address goes into the struct, and an error the kernel
    # records there is raised.
    err = torch.zeros(4, dtype=torch.int64)
    monkeypatch.setenv("NVRTC_GATHER_DEBUG", "1")
    monkeypatch.setattr(runtime, "error_buffer", lambda device: err)
    fake.on_launch = lambda: err.copy_(torch.tensor([3, 21, 2, 10 ** 6]))
    with pytest.raises(ValueError, match="row 21 .request 2. maps to physical block 1000000"):
        gather.cp_gather_indexer_k_quant_cache(*c.args())
    assert fake.params[:params.layout.size] == params.pack(**fields, error=err.data_ptr())
    err.zero_()
    fake.on_launch = lambda: err.copy_(torch.tensor([7, 5, 99999, 640]))
    with pytest.raises(ValueError, match="slot_mapping: entry 5 = 99999"):
        indexer_k_quant.indexer_k_quant_and_cache(*q.args())
    assert fake.params[:qparams.layout.size] == qparams.pack(**qfields, error=err.data_ptr())
    err.zero_()
    fake.on_launch = None
    gather.cp_gather_indexer_k_quant_cache(*c.args())  # nothing recorded: no error
    assert fake.params[:params.layout.size] == params.pack(**fields, error=err.data_ptr())
    # Debug mode off again: the launcher's struct (the same per-thread copy) has a null error
    # buffer, for the gather and for the write op.
    monkeypatch.delenv("NVRTC_GATHER_DEBUG")
    gather.cp_gather_indexer_k_quant_cache(*c.args())
    assert fake.params[:params.layout.size] == params.pack(**fields, error=0)
    indexer_k_quant.indexer_k_quant_and_cache(*q.args())
    assert fake.params[:qparams.layout.size] == qparams.pack(**qfields, error=0)


def test_gather_fast_path_launches_exactly_what_the_full_checks_would(fake, monkeypatch):
    """A layout validated once is remembered by its metadata; a later call with that metadata
    and other pointers launches exactly what plan_gather would have (vector width from the new
    pointers' alignment included), and pointers the checks reject still raise."""
    import torch

    from nvrtc_gather.ops import gather

    real_plan = gather.plan_gather
    planned = []

    def plan_on_device_0(*args):  # CPU tensors, planned as if on cuda:0
        planned.append(1)
        return real_plan(*args)._replace(device=0, tokens_per_cta=8)
    monkeypatch.setattr(gather, "plan_gather", plan_on_device_0)
    monkeypatch.setattr(runtime, "current_stream", lambda device: 0)
    monkeypatch.setattr(gather, "_layouts", gather.LayoutMemo())
    fake.current = 7

    kv = torch.randint(0, 256, (6, 16, 132), dtype=torch.uint8)
    bt = torch.tensor([[3, 1, 0], [5, 2, 4]], dtype=torch.int32)
    cu = torch.tensor([0, 20, 45], dtype=torch.int32)
    store = torch.zeros(64 * 128 + 64, dtype=torch.uint8)  # room to place dst_k at several alignments
    scales = torch.zeros(50, 4, dtype=torch.uint8)

    def dst_at(offset):
        return store[offset: offset + 50 * 128].view(50, 128)

    def expected(dst_k):
        plan = real_plan(kv, dst_k, scales, bt, cu)._replace(device=0, tokens_per_cta=8)
        name, grid, fields = gather.launch_config(plan)
        function = runtime.load(gather_kernels.MODULES[plan.vec], 0).functions[name]
        return (7, function), grid, gather_kernels.PARAMS.pack(**fields, error=0)

    def last_launch():
        return fake.launches[-1], fake.grid, fake.params[:gather_kernels.PARAMS.layout.size]

    gather.cp_gather_indexer_k_quant_cache(kv, dst_at(0), scales, bt, cu)  # validated in full, remembered
    assert len(planned) == 1 and len(gather._layouts) == 1 and last_launch() == expected(dst_at(0))
    for offset, vec in ((0, 16), (32, 16), (8, 8), (4, 4)):  # same metadata, new pointers: the fast path
        gather.cp_gather_indexer_k_quant_cache(kv, dst_at(offset), scales, bt, cu)
        assert len(planned) == 1, "the fast path was not taken"
        assert last_launch() == expected(dst_at(offset))
        tiny = runtime.load(gather_kernels.MODULES[vec], 0).functions[gather_kernels.entry_name(vec, "tiny")]
        assert fake.launches[-1][1] == tiny
    launches = len(fake.launches)
    with pytest.raises(ValueError, match="dst_k: data pointer"):  # misaligned: checked again, in full
        gather.cp_gather_indexer_k_quant_cache(kv, dst_at(2), scales, bt, cu)
    overlapping = kv.view(-1)[:50 * 128].view(50, 128)  # same metadata as dst_k, inside kv_cache
    with pytest.raises(ValueError, match="dst_k: its memory overlaps kv_cache"):
        gather.cp_gather_indexer_k_quant_cache(kv, overlapping, scales, bt, cu)
    assert len(fake.launches) == launches and len(planned) == 3


def test_write_op_fast_path_launches_exactly_what_the_full_checks_would(fake, monkeypatch):
    """The write op shares the gather's layout fast path: remembered by its metadata (and
    quant_block_size, scale_fmt); a later call with new pointers launches what plan_quant would
    (vector width from k's new alignment included); pointers the checks reject still raise."""
    import torch

    from nvrtc_gather.ops import indexer_k_quant

    real_plan = indexer_k_quant.plan_quant
    planned = []

    def plan_on_device_0(*args):
        planned.append(1)
        return real_plan(*args)._replace(device=0)
    monkeypatch.setattr(indexer_k_quant, "plan_quant", plan_on_device_0)
    monkeypatch.setattr(runtime, "current_stream", lambda device: 0)
    monkeypatch.setattr(indexer_k_quant, "_layouts", indexer_k_quant.LayoutMemo())
    fake.current = 7

    kv = torch.zeros(8, 16, 132, dtype=torch.uint8)
    slots = torch.arange(40, dtype=torch.int64)
    store = torch.zeros(40 * 128 + 32, dtype=torch.bfloat16)

    def k_at(offset):
        return store[offset: offset + 40 * 128].view(40, 128)

    def expected(k):
        plan = real_plan(k, kv, slots, 128, "ue8m0")._replace(device=0)
        name, grid, fields = indexer_k_quant.launch_config(plan)
        function = runtime.load(quant_kernels.MODULES["bf16", plan.vec, indexer_k_quant.call_shape(plan)], 0).functions[name]
        return (7, function), grid, quant_kernels.PARAMS.pack(**fields, error=0)

    def last_launch():
        return fake.launches[-1], fake.grid, fake.params[:quant_kernels.PARAMS.layout.size]

    indexer_k_quant.indexer_k_quant_and_cache(k_at(0), kv, slots, 128, "ue8m0")
    assert len(planned) == 1 and len(indexer_k_quant._layouts) == 1 and last_launch() == expected(k_at(0))
    for offset, vec in ((8, 16), (4, 8), (1, 0), (0, 16)):  # bf16 elements: 16, 8, 2, 0 bytes off
        indexer_k_quant.indexer_k_quant_and_cache(k_at(offset), kv, slots, 128, "ue8m0")
        assert len(planned) == 1, "the fast path was not taken"
        assert last_launch() == expected(k_at(offset))
        # (the plan is a CPU one relabelled: no SM count, so the usual shape)
        assert fake.launches[-1][1] == runtime.load(quant_kernels.MODULES["bf16", vec, ""], 0).functions[
            quant_kernels.entry_name("bf16", vec)]
    indexer_k_quant.indexer_k_quant_and_cache(k_at(0), kv, slots, 128, "fp8_e4m3")  # another layout
    assert len(planned) == 2
    launches = len(fake.launches)
    with pytest.raises(ValueError, match="kv_cache: its memory overlaps k"):
        indexer_k_quant.indexer_k_quant_and_cache(kv.view(-1)[:40 * 256].view(torch.bfloat16).view(40, 128), kv,
                                                  slots, 128, "ue8m0")
    with pytest.raises(TypeError, match="quant_block_size"):  # True == 1 must not hit a layout of 1
        indexer_k_quant.indexer_k_quant_and_cache(k_at(0), kv, slots, True, "ue8m0")
    assert len(fake.launches) == launches


@pytest.mark.parametrize("dtype, head_dim, qbs", [(torch_dtype, hd, qbs) for torch_dtype in ("bfloat16", "float32")
                                                  for hd, qbs in ((4, 1), (4, 2), (2048, 128), (4096, 4096), (1024, 32))])
def test_write_op_layouts_of_unusual_shapes_launch_what_the_plan_says(fake, monkeypatch, dtype, head_dim, qbs):
    """A layout prepares a launch only for the vector widths its shape can take (a 4-wide head
    has none: the generic kernel), and the launch is the plan's."""
    import torch

    from nvrtc_gather.ops import indexer_k_quant

    real_plan = indexer_k_quant.plan_quant
    monkeypatch.setattr(indexer_k_quant, "plan_quant", lambda *a: real_plan(*a)._replace(device=0))
    monkeypatch.setattr(runtime, "current_stream", lambda device: 0)
    monkeypatch.setattr(indexer_k_quant, "_layouts", indexer_k_quant.LayoutMemo())
    fake.current = 7
    k = torch.randn(3, head_dim, dtype=getattr(torch, dtype))
    kv = torch.zeros(2, 4, head_dim + 4 * (head_dim // qbs), dtype=torch.uint8)
    slots = torch.arange(3, dtype=torch.int64)
    indexer_k_quant.indexer_k_quant_and_cache(k, kv, slots, qbs, "ue8m0")
    plan = real_plan(k, kv, slots, qbs, "ue8m0")
    name, grid, fields = indexer_k_quant.launch_config(plan)
    assert fake.grid == grid and fake.params[:quant_kernels.PARAMS.layout.size] == quant_kernels.PARAMS.pack(
        **fields, error=0)


def test_mla_write_op_launches_what_launch_config_says_and_takes_the_fast_path(fake, monkeypatch):
    """concat_and_cache_mla's CUDA branch: the launched entry, grid and struct bytes are
    launch_config's of the full plan (fp8_ds_mla: the vector width from the new pointers'
    alignment); a second call with the same layout takes the fast path (no plan_write), a
    misaligned or overlapping one is checked in full again and refused."""
    import torch

    from nvrtc_gather.kernels import mla_cache
    from nvrtc_gather.ops import mla_write

    real_plan = mla_write.plan_write
    planned = []

    def plan_on_device_0(*args):
        planned.append(1)
        return real_plan(*args)._replace(device=0)
    monkeypatch.setattr(mla_write, "plan_write", plan_on_device_0)
    monkeypatch.setattr(runtime, "current_stream", lambda device: 0)
    monkeypatch.setattr(mla_write, "_layouts", mla_write.LayoutMemo())
    fake.current = 7

    kv = torch.zeros(4, 16, 656, dtype=torch.uint8)
    slots = torch.arange(20, dtype=torch.int64)
    store = torch.zeros(20 * 576 + 64, dtype=torch.bfloat16)
    scale = torch.ones(1)

    def inputs(offset):
        x = store[offset: offset + 20 * 576].view(20, 576)
        return x[:, :512], x[:, 512:]

    def expected(kv_c, k_pe, fmt="fp8_ds_mla", cache=kv):
        plan = real_plan(kv_c, k_pe, cache, slots, fmt, scale)._replace(device=0)
        cfg = mla_write.launch_config(plan)
        function = runtime.load(mla_write._module(plan), 0).functions[cfg.entry]
        return (7, function), cfg.grid, mla_cache.WRITE_PARAMS.pack(**cfg.fields, error=0)

    def last_launch():
        return fake.launches[-1], fake.grid, fake.params[:mla_cache.WRITE_PARAMS.layout.size]

    mla_write.concat_and_cache_mla(*inputs(0), kv, slots, "fp8_ds_mla", scale)
    assert len(planned) == 1 and last_launch() == expected(*inputs(0)) and fake.block == mla_cache.THREADS
    for offset, vec in ((8, 16), (1, 0), (0, 16)):  # bf16 elements: 16 bytes, 2 bytes off
        mla_write.concat_and_cache_mla(*inputs(offset), kv, slots, "fp8_ds_mla", scale)
        assert len(planned) == 1, "the fast path was not taken"
        assert last_launch() == expected(*inputs(offset))
        assert fake.launches[-1][1] == runtime.load(mla_cache.DS_MODULES["bf16"], 0).functions[
            mla_cache.ds_entry("bf16", vec)]
    plain = torch.zeros(4, 16, 576, dtype=torch.bfloat16)
    mla_write.concat_and_cache_mla(*inputs(0), plain, slots, "auto", scale)  # another layout: planned
    assert len(planned) == 2 and last_launch() == expected(*inputs(0), "auto", plain)
    launches = len(fake.launches)
    with pytest.raises(ValueError, match="kv_cache: its memory overlaps kv_c"):
        mla_write.concat_and_cache_mla(kv.view(-1)[:20 * 1024].view(torch.bfloat16).view(20, 512), inputs(0)[1], kv,
                                       slots, "fp8_ds_mla", scale)
    with pytest.raises(ValueError, match="kv_cache: data pointer"):
        mla_write.concat_and_cache_mla(*inputs(0), torch.zeros(4 * 16 * 656 + 2, dtype=torch.uint8)[2:].view(4, 16, 656),
                                       slots, "fp8_ds_mla", scale)
    assert len(fake.launches) == launches


def test_mla_gather_op_launches_what_launch_config_says_and_takes_the_fast_path(fake, monkeypatch):
    """cp_gather_and_upconvert_fp8_kv_cache's CUDA branch, as the write op's above; and debug
    mode: the error buffer goes into the struct and a recorded error is raised."""
    import torch

    from nvrtc_gather.kernels import mla_cache
    from nvrtc_gather.ops import mla_gather

    real_plan = mla_gather.plan_gather
    planned = []

    def plan_on_device_0(*args):
        planned.append(1)
        return real_plan(*args)._replace(device=0, rows_per_cta=8)
    monkeypatch.setattr(mla_gather, "plan_gather", plan_on_device_0)
    monkeypatch.setattr(runtime, "current_stream", lambda device: 0)
    monkeypatch.setattr(mla_gather, "_layouts", mla_gather.LayoutMemo())
    fake.current = 7

    cache = torch.zeros(8, 16, 656, dtype=torch.uint8)  # room for a dst inside it
    bt = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)
    ws = torch.tensor([0, 20], dtype=torch.int32)
    seq = torch.tensor([2, 0], dtype=torch.int32)
    store = torch.zeros(40 * 576 + 64, dtype=torch.bfloat16)

    def dst_at(offset):
        return store[offset: offset + 40 * 576].view(40, 576)

    def expected(dst):
        plan = real_plan(cache, dst, bt, ws, 2, seq)._replace(device=0, rows_per_cta=8)
        cfg = mla_gather.launch_config(plan)
        function = runtime.load(mla_cache.GATHER_MODULE, 0).functions[cfg.entry]
        return (7, function), cfg.grid, mla_cache.GATHER_PARAMS.pack(**cfg.fields, error=0)

    def last_launch():
        return fake.launches[-1], fake.grid, fake.params[:mla_cache.GATHER_PARAMS.layout.size]

    mla_gather.cp_gather_and_upconvert_fp8_kv_cache(cache, dst_at(0), bt, ws, 2, seq)
    assert len(planned) == 1 and last_launch() == expected(dst_at(0)) and fake.grid == 5
    for offset, vec in ((8, 16), (2, 0), (0, 16)):  # bf16 elements: 16 and 4 bytes off
        mla_gather.cp_gather_and_upconvert_fp8_kv_cache(cache, dst_at(offset), bt, ws, 2, seq)
        assert len(planned) == 1, "the fast path was not taken"
        assert last_launch() == expected(dst_at(offset))
        assert fake.launches[-1][1] == runtime.load(mla_cache.GATHER_MODULE, 0).functions[mla_cache.gather_entry(vec)]
    mla_gather.cp_gather_and_upconvert_fp8_kv_cache(cache, dst_at(0), bt, ws, 2, None)  # another layout
    assert len(planned) == 2
    launches = len(fake.launches)
    with pytest.raises(ValueError, match="dst: data pointer"):
        mla_gather.cp_gather_and_upconvert_fp8_kv_cache(cache, dst_at(1), bt, ws, 2, seq)
    with pytest.raises(ValueError, match="dst: its memory overlaps src_cache"):
        mla_gather.cp_gather_and_upconvert_fp8_kv_cache(cache, cache.view(-1)[:40 * 1152].view(torch.bfloat16)
                                                        .view(40, 576), bt, ws, 2, seq)
    assert len(fake.launches) == launches

    err = torch.zeros(4, dtype=torch.int64)
    monkeypatch.setenv("NVRTC_GATHER_DEBUG", "1")
    monkeypatch.setattr(runtime, "error_buffer", lambda device: err)
    fake.on_launch = lambda: err.copy_(torch.tensor([9, 1, -3, 0]))
    with pytest.raises(ValueError, match="seq_starts"):
        mla_gather.cp_gather_and_upconvert_fp8_kv_cache(cache, dst_at(0), bt, ws, 2, seq)
    want = expected(dst_at(0))
    cfg = mla_gather.launch_config(real_plan(cache, dst_at(0), bt, ws, 2, seq)._replace(device=0, rows_per_cta=8))
    assert fake.params[:mla_cache.GATHER_PARAMS.layout.size] == mla_cache.GATHER_PARAMS.pack(**cfg.fields,
                                                                                             error=err.data_ptr())
    assert fake.launches[-1] == want[0]


def test_layout_vector_widths_by_alignment_are_the_specs_choice(fake, monkeypatch):
    """A layout picks the vector width from its table (fast_path.widths_by_alignment, the low 4
    bits of the pointers) instead of calling the spec: the same width for any pointer."""
    import random

    import torch

    from nvrtc_gather.kernels import gather as gspec, indexer_k_quant as qspec
    from nvrtc_gather.ops import gather, indexer_k_quant
    from helpers.reference import make_gather_case

    rng = random.Random(3)
    c = make_gather_case(rng, block_size=16, head_dim=128, quant_block_size=64, batch=3, strided=False)
    for row_stride in (128, 136, 132):  # dst_k's row stride in bytes adds 16-, 8- and 4-byte bits
        plan = gather.plan_gather(*c.args())._replace(device=0, tokens_per_cta=8, dst_k_row_stride=row_stride)
        layout = gather._layout(plan)
        for _ in range(200):
            kv_p, k_p = rng.randrange(0, 1 << 48, 4), rng.randrange(0, 1 << 48, 4)
            assert layout.widths[(kv_p | k_p) & 15] == gspec.vector_width(kv_p | k_p | gather._low_bits(plan))
    k = torch.zeros(8, 128, dtype=torch.bfloat16)
    kv = torch.zeros(2, 16, 136, dtype=torch.uint8)  # head_dim + 4 * 128 / 64
    for k_row_stride in (256, 264, 260):
        plan = indexer_k_quant.plan_quant(k, kv, torch.arange(8), 64, "ue8m0")._replace(
            device=0, k_row_stride=k_row_stride)
        layout = indexer_k_quant._layout(plan)
        for _ in range(200):
            k_p = rng.randrange(0, 1 << 48, 2)
            assert layout.widths[k_p & 15] == qspec.vector_width(k_p | indexer_k_quant._low_bits(plan), 2, 128, 64)


@pytest.mark.parametrize("op", ["cp_gather_cache", "gather_and_maybe_dequant_cache"])
def test_cache_gather_ops_launch_what_launch_config_says_and_take_the_fast_path(fake, monkeypatch, op):
    """cp_gather_cache's and gather_and_maybe_dequant_cache's CUDA branch against the fake
    driver: the first call plans, later ones with new pointers take the fast path and launch
    exactly what the full checks would (the widest entry point, or ANY for a destination off
    16-byte alignment); a misaligned or overlapping destination falls through to the full
    checks and raises with nothing launched; debug mode passes the error buffer and raises."""
    import torch

    from nvrtc_gather.kernels import cache_gather as spec
    from nvrtc_gather.ops import cache_gather

    real_plan = cache_gather.plan_gather
    planned = []

    def plan_on_device_0(*args):
        planned.append(1)
        return real_plan(*args)._replace(device=0, rows_per_cta=8)
    monkeypatch.setattr(cache_gather, "plan_gather", plan_on_device_0)
    monkeypatch.setattr(runtime, "current_stream", lambda device: 0)
    monkeypatch.setattr(cache_gather, "_layouts", cache_gather.LayoutMemo())
    fake.current = 7

    cache = torch.zeros(8, 16, 576, dtype=torch.uint8)
    bt = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)
    cu = torch.tensor([0, 20, 38], dtype=torch.int32)
    seq = torch.tensor([2, 0], dtype=torch.int32)
    scale = torch.ones(1)
    conv = "copy" if op == "cp_gather_cache" else "e4m3_bf16"
    dtype = torch.uint8 if conv == "copy" else torch.bfloat16
    store = torch.zeros(40 * 576 + 64, dtype=dtype)

    def dst_at(offset):
        return store[offset: offset + 40 * 576].view(40, 576)

    def args(dst, seq_starts=seq):
        if op == "cp_gather_cache":
            return cache, dst, bt, cu, 2, seq_starts
        return cache, dst, bt, cu, cu, 40, "fp8", scale, seq_starts

    def expected(dst):
        n = len(planned)
        plan = cache_gather.plan_for(op, *args(dst))._replace(device=0, rows_per_cta=8)
        del planned[n:]  # plan_for runs plan_gather too: not the op's planning
        cfg = cache_gather.launch_config(plan)
        module = spec.MODULES[conv, (plan.vec, plan.svec)]
        function = runtime.load(module, 0).functions[cfg.entry]
        return (7, function), cfg.grid, spec.PARAMS.pack(**cfg.fields, error=0)

    def last_launch():
        return fake.launches[-1], fake.grid, fake.params[:spec.PARAMS.layout.size]

    run = getattr(cache_gather, op)
    run(*args(dst_at(0)))
    assert len(planned) == 1 and last_launch() == expected(dst_at(0)) and fake.grid == 5
    esz = dtype.itemsize
    for offset in (16 // esz, 4 // esz, 0):  # 16 and 4 bytes off
        run(*args(dst_at(offset)))
        assert len(planned) == 1, "the fast path was not taken"
        assert last_launch() == expected(dst_at(offset))
        widths = spec.widest(conv) if offset * esz % 16 == 0 else spec.ANY
        module = spec.MODULES[conv, widths]
        assert fake.launches[-1][1] == runtime.load(module, 0).functions[spec.entry_name(conv, *widths)]
    run(*args(dst_at(0), None))  # another layout
    assert len(planned) == 2
    cache_gather.prepared(op, *args(dst_at(4 // esz)))()  # the benchmarks' hook: the same launch
    assert last_launch() == expected(dst_at(4 // esz))
    launches = len(fake.launches)
    if esz == 1:
        with pytest.raises(ValueError, match="dst: data pointer"):
            run(*args(dst_at(1)))
    bad = cache.view(-1)[:40 * 576 * esz].view(dtype).view(40, 576)
    with pytest.raises(ValueError, match="dst: its memory overlaps src_cache"):
        run(*args(bad))
    assert len(fake.launches) == launches

    err = torch.zeros(4, dtype=torch.int64)
    monkeypatch.setenv("NVRTC_GATHER_DEBUG", "1")
    monkeypatch.setattr(runtime, "error_buffer", lambda device: err)
    fake.on_launch = lambda: err.copy_(torch.tensor([10, 0, -3, 0]))
    with pytest.raises(ValueError, match="cu_seq_lens: entry 0 = -3 is negative"):
        run(*args(dst_at(0)))
    cfg = cache_gather.launch_config(cache_gather.plan_for(op, *args(dst_at(0)))._replace(device=0, rows_per_cta=8))
    assert fake.params[:spec.PARAMS.layout.size] == spec.PARAMS.pack(**cfg.fields, error=err.data_ptr())


def _view_cases():
    """(op module name, plan function, plan fields to set, a valid call's arguments, the argument
    index and name made a view): tensors of the dtypes public torch makes such views of
    (complex tensors and their .real/.imag parts)."""
    import torch

    bt, cu = torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([0, 4], dtype=torch.int32)
    gather_args = lambda: (torch.randn(2, 4, 4, dtype=torch.complex64), torch.zeros(4, 4, dtype=torch.complex64),  # noqa: E731
                           bt, cu, 1)
    return [
        ("cache_gather", "cp_gather_cache", "plan_gather", {"rows_per_cta": 8}, gather_args, 0, "src_cache"),
        ("cache_gather", "cp_gather_cache", "plan_gather", {"rows_per_cta": 8}, gather_args, 1, "dst"),
        ("indexer_k_quant", "indexer_k_quant_and_cache", "plan_quant", {},
         lambda: (torch.randn(2, 128), torch.zeros(2, 16, 132, dtype=torch.uint8), torch.tensor([0, 1]), 128, "ue8m0"),
         0, "k"),
        ("indexer_k_scatter", "indexer_k_scatter", "plan_scatter", {},
         lambda: (torch.zeros(2, 128, dtype=torch.uint8), torch.ones(2, 1), torch.zeros(2, 16, 132, dtype=torch.uint8),
                  torch.tensor([0, 1])), 1, "k_scale"),
        ("mla_write", "concat_and_cache_mla", "plan_write", {},
         lambda: (torch.randn(2, 512, dtype=torch.float16), torch.randn(2, 64, dtype=torch.float16),
                  torch.zeros(1, 16, 656, dtype=torch.uint8),
                  torch.tensor([0, 1]), "fp8_ds_mla", torch.ones(1)), 0, "kv_c"),
        ("mla_write", "concat_and_cache_mla", "plan_write", {},
         lambda: (torch.randn(2, 8), torch.randn(2, 4), torch.zeros(1, 16, 12, dtype=torch.uint8),
                  torch.tensor([0, 1]), "fp8", torch.ones(1)), 5, "scale"),
        ("cache_gather", "gather_and_maybe_dequant_cache", "plan_gather", {"rows_per_cta": 8},
         lambda: (torch.randint(0, 255, (2, 4, 8), dtype=torch.uint8), torch.zeros(4, 8, dtype=torch.bfloat16), bt, cu,
                  torch.zeros(4, dtype=torch.int32), 4, "fp8", torch.ones(1)), 7, "scale"),
    ]


@pytest.mark.parametrize("view", ["conjugate", "negative"])
@pytest.mark.parametrize("case", range(7))
def test_a_view_whose_bytes_are_not_its_values_never_takes_a_remembered_layout(fake, monkeypatch, case, view):
    """Issue 37 item 6 on the CUDA branch: a call remembered for plain tensors, then the same
    metadata with a conjugate or negative view: the fast path does not serve it, the full checks
    refuse it by name, nothing launched (before: the layout's key had no view bits)."""
    import importlib

    import torch

    module_name, op, plan_name, fields, make, index, name = _view_cases()[case]
    module = importlib.import_module(f"nvrtc_gather.ops.{module_name}")
    real_plan = getattr(module, plan_name)
    monkeypatch.setattr(module, plan_name, lambda *a: real_plan(*a)._replace(device=0, **fields))
    monkeypatch.setattr(runtime, "current_stream", lambda device: 0)
    monkeypatch.setattr(module, "_layouts", module.LayoutMemo())
    fake.current = 7
    args = list(make())
    getattr(module, op)(*args)  # validated in full, remembered
    assert len(fake.launches) == 1 and len(module._layouts) == 1
    if view == "conjugate":
        if not args[index].is_complex():
            pytest.skip("torch makes conjugate views of complex tensors only")
        args[index] = args[index].conj()
    else:
        args[index] = torch._neg_view(args[index])
    with pytest.raises(TypeError, match=rf"^{name}: expected a plain tensor, got a {view} view"):
        getattr(module, op)(*args)
    assert len(fake.launches) == 1
