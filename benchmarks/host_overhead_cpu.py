"""Host cost per call of the ops' repeated-layout path, measured on CPU (no GPU needed).

The ops' CUDA branch (layout key, memo, pointer checks, vector width, packing, the launcher)
runs for CPU tensors relabelled as device 0, as tests/jit/test_runtime_fake_driver.py drives
it, on a fake driver whose calls do nothing: the numbers are the Python glue around the
driver's launch, not what a GPU host pays (the launch through ctypes adds ~4 µs there, the
metadata reads cost more). torch's ``copy_`` of a 1 KiB CPU tensor, measured the same way in
the same run, is the local yardstick.

    python benchmarks/host_overhead_cpu.py [--calls 20000] [--rounds 5]

Each entry point is timed as the median of single calls by timing.host_costs (bursts of 250,
interleaved with the other entries), ``--rounds`` times; the lowest median is printed."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

# Measure the checkout this script lives in, not whichever nvrtc_gather is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nvrtc_gather  # noqa: E402
from nvrtc_gather.integrations import vllm as vllm_adapter  # noqa: E402
from nvrtc_gather.jit import driver, runtime, spec as jit_spec  # noqa: E402
from nvrtc_gather.ops import gather, indexer_k_quant  # noqa: E402
from bench import metadata_reads  # noqa: E402  (the floor bench.py measures on the GPU host)
from timing import host_costs  # noqa: E402


class NoopDriver:
    """The raw entry points the launcher calls, doing nothing. Every launch succeeds, so the
    launcher never asks for the current context (it does only when a launch is refused)."""

    def __init__(self):
        self.launches = 0

    def ctx_get_current(self, ref):
        return 0

    def launch_ex(self, cfg, function, params, extra):
        self.launches += 1
        return 0


def install_fake_driver() -> NoopDriver:
    """Route the ops' CUDA branch to a no-op driver, with CPU tensors planned as cuda:0."""
    fake = NoopDriver()
    driver.raw = lambda: fake
    driver.primary_context = lambda device: None
    # torch's stream query (a ~0.1 µs C call) is a C builtin here, 0 for device 0; runtime.py
    # before issue 18 called it through _raw_stream.
    setattr(runtime, "_raw_stream" if hasattr(runtime, "_raw_stream") else "current_stream", abs)
    for module in jit_spec.registered():  # every module "loaded" on device 0, no NVRTC
        functions = {name: i + 1 for i, name in enumerate(module.kernels)}
        runtime._loaded[module.name, 0] = runtime.LoadedModule(module, 0, functions)
    real_gather, real_quant = gather.plan_gather, indexer_k_quant.plan_quant
    gather.plan_gather = lambda *a: real_gather(*a)._replace(device=0, tokens_per_cta=8)
    indexer_k_quant.plan_quant = lambda *a: real_quant(*a)._replace(device=0)
    return fake


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    opts = ap.parse_args()

    real_plan_gather = gather.plan_gather
    fake = install_fake_driver()
    vllm_adapter.register()  # no vLLM here: its schemas are defined by the adapter, with CPU kernels
    vllm_ops, ng_ops = torch.ops._C_cache_ops, torch.ops.nvrtc_gather

    torch.manual_seed(0)
    kv = torch.randint(0, 256, (16, 64, 132), dtype=torch.uint8)
    bt = torch.arange(16, dtype=torch.int32).view(1, 16)
    cu = torch.tensor([0, 1000], dtype=torch.int32)
    dst_k = torch.empty(1000, 128, dtype=torch.float8_e4m3fn)
    dst_s = torch.empty(1000, 4, dtype=torch.uint8)
    gargs = (kv, dst_k, dst_s, bt, cu)
    k = torch.randn(1000, 128, dtype=torch.bfloat16)
    kv_q = torch.zeros_like(kv)
    slots = torch.arange(1000, dtype=torch.int64)
    qargs = (k, kv_q, slots, 128, "ue8m0")
    a, b = torch.empty(256), torch.empty(256)  # 1 KiB each

    entries = {
        "torch copy_ (1 KiB, CPU)": (a.copy_, (b,)),
        "nvrtc_gather.cp_gather_indexer_k_quant_cache": (nvrtc_gather.cp_gather_indexer_k_quant_cache, gargs),
        "nvrtc_gather.indexer_k_quant_and_cache": (nvrtc_gather.indexer_k_quant_and_cache, qargs),
        "torch.ops.nvrtc_gather (gather)": (ng_ops.cp_gather_indexer_k_quant_cache, gargs),
        "torch.ops.nvrtc_gather (write)": (ng_ops.indexer_k_quant_and_cache, qargs),
        "torch.ops._C_cache_ops, vLLM adapter (gather)": (vllm_ops.cp_gather_indexer_k_quant_cache, gargs),
        "torch.ops._C_cache_ops, vLLM adapter (write)": (vllm_ops.indexer_k_quant_and_cache, qargs),
        "full checks (plan_gather)": (real_plan_gather, gargs),
        "floor: metadata reads, 5 tensors": (metadata_reads, gargs),
    }
    # Every op entry point must launch once per call through the fast path (its layout was
    # validated by the first call); check that before timing.
    for name, (fn, args) in entries.items():
        if name.startswith(("nvrtc_gather.", "torch.ops.")):
            fn(*args)
            before = fake.launches
            fn(*args)
            assert fake.launches == before + 1, f"{name}: no launch"
    best = dict.fromkeys(entries, float("inf"))
    for _ in range(opts.rounds):
        for name, us in host_costs(entries, opts.calls, sync=lambda: None).items():
            best[name] = min(best[name], us)
    copy_us = best["torch copy_ (1 KiB, CPU)"]
    print(f"nvrtc_gather from {Path(nvrtc_gather.__file__).parent}")
    print(f"CPU fake-driver host cost, µs per call (lowest median of {opts.rounds} rounds x {opts.calls} calls)")
    for name, us in best.items():
        print(f"  {name:<48} {us:6.2f}  ({us / copy_us:.2f}x copy_)")


if __name__ == "__main__":
    main()
