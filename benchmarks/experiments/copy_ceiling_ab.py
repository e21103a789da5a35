"""Where the chunked gathers' ceiling sits (issue 27: one large request at 1.10-1.14x a device
copy_ of the same bytes): the copy_ against contiguous copies written as kernels
(copy_ceiling.cu: the tile kernel's shape with plain loads and with L1::no_allocate /
L2::256B loads, and the bulk copy engine through shared memory), and the op's tile kernel
against a build whose loads carry that hint. Each kernel's output checked byte for byte,
then all timed interleaved, L2 flushed before each run. From the repository root with
PYTHONPATH=.:benchmarks: ``python benchmarks/experiments/copy_ceiling_ab.py``."""
import dataclasses
import tempfile
from pathlib import Path

import torch

import bench_cache_gather as b
from bench_mla import _first_diff
from timing import flush_buffer, l2_bytes, summarize, time_samples
from nvrtc_gather.jit import runtime, sources
from nvrtc_gather.jit.spec import Entry
from nvrtc_gather.kernels import cache_gather as spec
from nvrtc_gather.ops import cache_gather

HERE = Path(__file__).resolve().parent
LD_HINT = r'''
__device__ __forceinline__ uint4 ld_hint(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 ld_hint(const uint2* p) {
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
__device__ __forceinline__ u32 ld_hint(const u32* p) {
    u32 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
'''
PLAIN_LOAD = "v[u] = __ldg(reinterpret_cast<const V*>(src) + c);"
build = Path(tempfile.mkdtemp())
src = sources.read_source("cache_gather.cu")
assert src.count(PLAIN_LOAD) == 1
marker = '#include "request_search.cuh"\n'
src = src.replace(marker, marker + LD_HINT)
(build / "copy_exp.cu").write_text(src + (HERE / "copy_ceiling.cu").read_text())
(build / "hint_exp.cu").write_text(src.replace(PLAIN_LOAD, "v[u] = ld_hint(reinterpret_cast<const V*>(src) + c);"))
SMS = torch.cuda.get_device_properties(0).multi_processor_count
DEV = torch.cuda.current_device()


def module(name, source, entries, threads=256):
    base = spec.MODULES["copy", (16, 16)]
    return dataclasses.replace(base, name=name, source=source, source_dir=str(build), entries=entries, threads=threads)


KCOPY = module("copy_exp", "copy_exp.cu", (Entry("exp_kcopy"), Entry("exp_kcopy_hint")))
TMA = module("copy_exp_tma", "copy_exp.cu", (Entry("exp_tma"),), threads=32)
HINT = {conv: dataclasses.replace(spec.MODULES[conv, w], name=spec.MODULES[conv, w].name + "_hint",
                                  source="hint_exp.cu", source_dir=str(build))
        for conv, w in (("copy", (16, 16)), ("e4m3_bf16", (8, 16)))}


def kernel_copy(mod, entry, src, dst, grid):
    fields = {n: 0 for n in spec.PARAMS.names if n != "error"}
    fields.update(src_cache=src.data_ptr(), dst=dst.data_ptr(), block_stride=src.numel())
    go = runtime.load(mod, DEV, runtime.current_stream(DEV)).launcher(entry, grid, spec.PARAMS.image(**fields))
    return lambda _keep=(src, dst): go(())


def main():
    l2, flush = l2_bytes(), flush_buffer()
    print("contiguous copies (us; moved = read + written)")
    for moved in (75497472, 150994944, 167006592, 288734976):
        gen = torch.Generator(device="cuda").manual_seed(moved)
        src = torch.randint(0, 256, (moved // 2,), dtype=torch.uint8, device="cuda", generator=gen)
        n = src.numel()
        fns = {}
        for name, make in (
                ("kcopy", lambda d: kernel_copy(KCOPY, "exp_kcopy", src, d, -(-n // 16384))),
                ("kcopy_hint", lambda d: kernel_copy(KCOPY, "exp_kcopy_hint", src, d, -(-n // 16384))),
                ("tma2", lambda d: kernel_copy(TMA, "exp_tma", src, d, min(-(-n // 16368), 2 * SMS))),
                ("tma4", lambda d: kernel_copy(TMA, "exp_tma", src, d, min(-(-n // 16368), 4 * SMS)))):
            d = torch.zeros_like(src)
            fns[name] = make(d)
            fns[name]()
            torch.cuda.synchronize()
            assert torch.equal(d, src), name
        dcopy = torch.empty_like(src)
        fns["copy_"] = lambda: dcopy.copy_(src)
        row = {}
        summarize(row, time_samples(fns, flush, 200))
        print(f"{moved / 1e6:8.1f} MB: " + ", ".join(f"{k} {row[k + '_us']:.2f} ({moved / row[k + '_us'] / 1e3:.0f} GB/s)"
                                                    for k in fns), flush=True)
        src = fns = d = dcopy = None
        torch.cuda.empty_cache()

    print("the op's tile kernel, plain loads against hinted ones")
    for variant in b.VARIANTS:
        if variant[0] == "dequant auto bf16":
            continue
        for batch, mean in [(1, 65536), (1, 131072), (8, 16384), (1024, 256)]:
            w = b.Workload(batch, mean, variant, False, l2, seed=batch * 7 + mean)
            want = w.dst()
            cache_gather.prepared(w.op, *w.args(want), tiny=False)()
            fns = {}
            plan = cache_gather.plan_for(w.op, *w.args(want))
            for name, mod in (("op", None), ("hint", HINT[plan.conversion])):
                dst = w.dst()
                fns[name] = cache_gather.prepared(w.op, *w.args(dst), module=mod, tiny=False)
                fns[name]()
                torch.cuda.synchronize()
                if not torch.equal(dst.view(torch.uint8), want.view(torch.uint8)):
                    raise AssertionError(f"{name} differs on {w.title}: " + _first_diff(dst, want))
            want = None
            src = torch.randint(0, 256, (w.moved // 2,), dtype=torch.uint8, device="cuda")
            dcopy = torch.empty_like(src)
            fns["copy_"] = lambda: dcopy.copy_(src)
            row = {}
            summarize(row, time_samples(fns, flush, 200))
            print(f"{w.title:>32}: " + ", ".join(f"{k} {row[k + '_us']:.2f}" for k in fns)
                  + f"; op/copy {row['op_us'] / row['copy__us']:.3f}, hint/copy {row['hint_us'] / row['copy__us']:.3f}",
                  flush=True)
            w = fns = src = dcopy = None
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
