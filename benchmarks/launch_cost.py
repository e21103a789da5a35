"""Host cost of one launch of the gather's tiny entry through ctypes: cuLaunchKernelEx (what the
launcher calls, 4 arguments) against cuLaunchKernel (11), beside torch's copy_ and the op, two
interleaved runs (timing.host_costs). ``python benchmarks/launch_cost.py`` on a GPU machine."""
import ctypes

import torch

import bench
from timing import host_costs
from nvrtc_gather.jit import driver, runtime
from nvrtc_gather.kernels import gather as gk
from nvrtc_gather.ops import gather

w = bench.Workload(1, 1000, 0, seed=1)
k, s = w.outputs()
dev = torch.cuda.current_device()
plan = gather.plan_gather(w.kv, k, s, w.block_table, w.cu)
name, grid, fields = gather.launch_config(plan)
stream = runtime.current_stream(dev)
fn = runtime.load(bench.GATHER, dev, stream).functions[name]
raw = driver.raw()
buf = ctypes.create_string_buffer(gk.PARAMS.layout.size)
gk.PARAMS.packer(**fields)(buf, 0)
params = (ctypes.c_void_p * 1)(ctypes.addressof(buf))
cfg = driver.LaunchConfig(grid, 1, 1, 256, 1, 1, 0, stream, None, 0)
cfg_addr = ctypes.addressof(cfg)
drv = driver._bindings()
pfn, _ = driver.check(drv.cuGetProcAddress(b"cuLaunchKernel", 12000, drv.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT), "cuGetProcAddress")
u, vp = ctypes.c_uint, ctypes.c_void_p
launch = ctypes.CFUNCTYPE(ctypes.c_int, vp, u, u, u, u, u, u, u, vp, vp, vp)(int(pfn))
params_addr = ctypes.addressof(params)
assert raw.launch_ex(cfg_addr, fn, params_addr, None) == 0
assert launch(fn, grid, 1, 1, 256, 1, 1, 0, stream, params_addr, None) == 0
torch.cuda.synchronize()
a, b = torch.empty(1024, device="cuda"), torch.empty(1024, device="cuda")
for _ in range(2):
    out = host_costs({"torch_copy_us": (a.copy_, (b,)),
                      "cuLaunchKernelEx_us": (raw.launch_ex, (cfg_addr, fn, params_addr, None)),
                      "cuLaunchKernel_us": (launch, (fn, grid, 1, 1, 256, 1, 1, 0, stream, params_addr, None)),
                      "gather_op_us": (gather.cp_gather_indexer_k_quant_cache, (w.kv, k, s, w.block_table, w.cu))})
    print({k_: round(v, 3) for k_, v in out.items()})
