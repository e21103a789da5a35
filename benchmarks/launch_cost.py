"""Host cost of one launch of the gather's tiny entry through ctypes: cuLaunchKernelEx (what the
launcher calls, 4 arguments) against cuLaunchKernel (11), beside torch's copy_ and the op, two
interleaved runs (timing.host_costs). ``python benchmarks/launch_cost.py`` on a GPU machine."""
import ctypes

import torch

import bench
from timing import host_costs
from nvrtc_gather.jit import driver
from nvrtc_gather.ops import gather

w = bench.Workload(1, 1000, 0, seed=1)
k, s = w.outputs()
r = bench.raw_gather_launch(w.kv, k, s, w.block_table, w.cu)
drv = driver._bindings()
pfn, _ = driver.check(drv.cuGetProcAddress(b"cuLaunchKernel", 12000, drv.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT), "cuGetProcAddress")
u, vp = ctypes.c_uint, ctypes.c_void_p
launch = ctypes.CFUNCTYPE(ctypes.c_int, vp, u, u, u, u, u, u, u, vp, vp, vp)(int(pfn))
ex_args = (r.cfg_addr, r.function, r.params_addr, None)
plain_args = (r.function, r.grid, 1, 1, bench.GATHER.threads, 1, 1, 0, r.stream, r.params_addr, None)
assert r.raw.launch_ex(*ex_args) == 0 and launch(*plain_args) == 0
torch.cuda.synchronize()
a, b = torch.empty(1024, device="cuda"), torch.empty(1024, device="cuda")
for _ in range(2):
    out = host_costs({"torch_copy_us": (a.copy_, (b,)),
                      "cuLaunchKernelEx_us": (r.raw.launch_ex, ex_args),
                      "cuLaunchKernel_us": (launch, plain_args),
                      "gather_op_us": (gather.cp_gather_indexer_k_quant_cache, (w.kv, k, s, w.block_table, w.cu))})
    print({k_: round(v, 3) for k_, v in out.items()})
