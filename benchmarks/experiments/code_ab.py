"""Does the index-K read lose time to its own code? Its debug reports (ng_report: an atomicCAS and
three stores, inlined at each of a dozen sites) make the read's entries 10-24 KB of sm_90 code,
the first value load 11 KB into the request-major entry, where SGLang's Triton read is a few KB.
After the L2 flush (and in an engine, after the other kernels of a layer) that code comes from
DRAM. Builds of the read, each timed through SGLang's entry (the launch rule's entry) beside
SGLang 0.5.23's Triton read and a copy of the same bytes; lengths int64, page ids int32, as SGLang
passes them. Bytes checked equal first; then REPS shuffled runs (L2 flushed, CUDA events),
medians and 25th-75th percentiles; then each build's code size.

    [REPS=300] python3 benchmarks/experiments/code_ab.py [BxM ...]

"read": as shipped. "same": main's sources rebuilt under another name (A/A). "noreport": every
report compiled out (not shippable: debug mode reports nothing; the bound on what the code's size
costs). "cold": each report an out-of-line call (__noinline__), its test of the error pointer left
inline; debug mode unchanged. "read_warm" and "sglang_warm": the shipped read and SGLang's, each
timed after a launch of its own kernel between the flush and the timed call (the read: its launch
of this call with 64 rows, into 64-row outputs; SGLang's: its Triton kernel on the same batch's
page table, the first request 64 long and the others empty), so its code is in the L2 and its data is not.

Prediction (written before the run): if code fetch after the flush costs the read time, noreport
is faster than same by 0.2-0.5 us on the tile rows (16x2048, 2x16384, 8x16384, 64x2048, 1x131072,
1024x256), cold by most of that, and the warp-a-row rows (1x1000, 8x100) move less (their entry
is smaller); and read_warm gains more on read than sglang_warm on SGLang's. If neither moves by
more than the A/A spread (0.1), the code's size is not where the read's event-timed gap to Triton
comes from. Decision: land cold where it is faster than same on
most tile rows and slower on none by more than 0.1."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import torch

import engine_entries as ee
from copy_ab import variant
from read_vs_gather import checked, layout_of, medians, rebuilt
import random

from timing import _SPIN_CYCLES, flush_buffer
from nvrtc_gather.integrations import sglang as hook
from nvrtc_gather.jit import compiler, sources
from nvrtc_gather.kernels import index_k_read as spec
from nvrtc_gather.ops import index_k_read

REPS = int(os.environ.get("REPS", 300))
WORKLOADS = [(2, 16384), (8, 16384), (16, 2048), (64, 2048), (1, 131072), (1024, 256), (1, 1000), (8, 100)]
# What follows the includes of index_k_read.cu in each build (ng_report is used only after them)
REPORTS = {
    "same": "",
    "noreport": "#define ng_report(err, code, a, b, c) ((void)0)\n",
    "cold": ("__device__ __noinline__ void ng_report_cold(i64* err, int code, i64 a, i64 b, i64 c) {\n"
             "    if (atomicCAS((u64*)err, 0ull, (u64)code) == 0ull) { err[1] = a; err[2] = b; err[3] = c; }\n"
             "}\n"
             "#define ng_report(err, code, a, b, c) do { if (err) ng_report_cold(err, code, a, b, c); } while (0)\n"),
}
ANCHOR = '#include "tile_copy.cuh"\n'


def build_dir(extra: str) -> str:
    """A copy of main's sources with ``extra`` after index_k_read.cu's includes."""
    out = Path(tempfile.mkdtemp())
    src = sources.read_source("index_k_read.cu")
    assert src.count(ANCHOR) == 1
    (out / "index_k_read.cu").write_text(src.replace(ANCHOR, ANCHOR + extra))
    return str(out)


BUILDS = {name: variant(spec.MODULES, name, build_dir(extra), {}) for name, extra in REPORTS.items()}


def code_sizes(module) -> str:
    """Each entry's code bytes (the cubin's .text sections) in an sm_90 build, where cuobjdump runs."""
    image = compiler.compile_module(module, compiler.pick_target(90)).image
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(image)
        f.flush()
        try:
            out = subprocess.run(["cuobjdump", "-elf", f.name], capture_output=True, text=True).stdout
        except FileNotFoundError:
            return "(no cuobjdump)"
    sizes = []
    for line in out.splitlines():
        parts = line.split()
        if "PROGBITS" in parts and parts[-1].startswith(".text."):  # index, offset, size (hex), ...
            sizes.append(f"{parts[-1][6:].replace(module.name, '') or '(row)'} {int(parts[2], 16)}")
    return ", ".join(sizes) or "(no .text sections listed)"


def warm_launches(w, layout, acc, p) -> dict:
    """name -> a launch of that function's kernel on 64 rows (read_warm) or 64-long requests
    (sglang_warm), run between the flush and the timed call."""
    n = min(64, w.tokens)
    go, tpc, blocks = index_k_read._call(layout, w.buf.data_ptr() & 15 | w.tokens << 4 | max(w.lens) << 36)
    k, s = w.buf.new_empty(n, 128), w.buf.new_empty(n, 4)
    ptrs = (w.buf.data_ptr(), k.data_ptr(), s.data_ptr(), w.lens_t.data_ptr(), w.block_table.data_ptr(), n, tpc)
    out = {"read_warm": lambda _outputs=(k, s): go(ptrs, 0, blocks)}  # the outputs live as long as the launch
    if acc:
        lens = torch.zeros_like(w.lens_t)
        lens[0] = n
        out["sglang_warm"] = lambda: acc.GetKAndS.triton(p, w.buf, w.block_table, lens, n, n)
    return out


def time_warm(fns: dict, pre: dict, flush, reps: int) -> dict:
    """timing.time_samples' shuffled runs, ``pre[name]`` (where given) launched after the spin,
    before the timed call's first event."""
    for fn in fns.values():
        fn()
    names, order = list(fns), random.Random(0)
    ev = {k: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
          for k in names}
    for i in range(reps):
        for k in order.sample(names, len(names)):
            flush.zero_()
            torch.cuda._sleep(_SPIN_CYCLES)
            if k in pre:
                pre[k]()
            ev[k][i][0].record()
            fns[k]()
            ev[k][i][1].record()
    torch.cuda.synchronize()
    return {k: [a.elapsed_time(b) * 1000.0 for a, b in ev[k]] for k in names}


def main(workloads):
    flush, acc, p = flush_buffer(), ee.accessor(), ee.pool()
    print(torch.cuda.get_device_name(), torch.__version__, "SGLang:", "yes" if acc else "no", flush=True)
    for batch, mean in workloads:
        w = ee.Workload(batch, mean)
        fns = {"read": lambda: hook.get_index_k_scale_buffer(*w.get_args())}
        fns["read"]()  # its layout remembered
        layout = layout_of(w)
        for name, modules in BUILDS.items():
            lay = rebuilt(layout, modules)
            fns[name] = lambda lay=lay: index_k_read._run(lay, w.buf, w.lens_t, w.block_table, w.tokens, max(w.lens))
        fns = checked(fns, w, acc, p)
        pre = warm_launches(w, layout, acc, p)
        fns["read_warm"] = fns["read"]
        if "sglang" in fns:
            fns["sglang_warm"] = fns["sglang"]
        got = time_warm(fns, pre, flush, REPS)
        print(f"{w.name} (read: {layout.launch(w.tokens, max(w.lens))}): " + medians(got), flush=True)
        w = fns = layout = None
        torch.cuda.empty_cache()
    for name, modules in {"main": spec.MODULES, **BUILDS}.items():
        print(f"{name}: {code_sizes(modules[(16, 'i64', 'i32')])}", flush=True)


if __name__ == "__main__":
    main([tuple(int(x) for x in a.split("x")) for a in sys.argv[1:]] or WORKLOADS)
