"""The tile copy (cuda_src/tile_copy.cuh, shared by the indexer gather and the index-K read's
tile entries) against two variants of its value loop, and the wide entries with a
__launch_bounds__ block count, in one process: the read through SGLang's entry (its launch
rule's entry) beside SGLang 0.5.23's Triton read (where it imports), the gather on the same rows
(gather.prepared, outputs allocated once) and a copy of the same bytes. Lengths int64 and page
ids int32, as SGLang passes them. Bytes checked equal first (the reads against each other, the
gathers against the read); then REPS shuffled runs (timing.time_samples: L2 flushed, CUDA
events), medians and 25th-75th percentiles; then each 16-byte entry's registers as loaded.

    [REPS=400] [VARIANTS=bounded,step,hoist] python3 benchmarks/experiments/copy_ab.py [BxM ...]

"read"/"gather": as shipped. "*_same": main's source rebuilt under another name (the A/A control:
a build's own effect). "*_bounded": the wide entries bounded at WIDE_RESIDENT blocks an SM (a wide
grid is at most one wave of 4 an SM: gather.tokens_per_cta). "*_rows6": also the row-major entry
bounded at 6 (its 40 registers allow 6). "*_step": bounded, and each thread's (row, column)
stepped by a constant (dt rows, dc columns, a column past the row carried into the next row)
instead of a division a vector. "*_hoist": also the destination computed once for a copied and a
zero row (written in both branches, ptxas issued the zero row's, predicated off, on every vector
of the read). The gathers share one destination (a build's time, not where its outputs lie).

Prediction (written before the first run, from sm_90 SASS under NVRTC 13.5, 16-byte entries): the
copy issues ~60 instructions a vector; "step" ~55 in the read and ~35 in the gather, "hoist"
~46 in the read; a thread's last load issues 100-180 instructions earlier. Expected 0.05-0.2 us
off the rows whose copy phase is the critical path (16x2048, 64x2048, 2x16384, 1024x256; gather
and read alike), nothing on the warp-a-row calls. The bound: NVRTC 13.5 gives the gather's
16-byte wide entry 70 registers (3 blocks an SM); where the device's NVRTC does too, "gather" is
slower than "gather_bounded" at the wide rows (1x131072). Under NVRTC 13.5 "hoist" splits the
skip pass of the int32-lengths / int64-ids read entry (tests/jit/test_sass_order.py); "step"
passes every SASS test. Decision: land "step" (with the bound) if faster than "bounded" on most
rows and slower on none by more than 0.1 us.

Results (H100, NVRTC 13.0: every 16-byte wide entry 64 registers with or without the bound).
Run 1 (all builds, 10 rows): "step" slower than "bounded" by 0.74 us at 64x2048, so it does not
land; "hoist" within 0.15 of "bounded" everywhere. The bound alone: the read 0.6 us faster at
1x131072 and 64x2048, the gather 1.2-1.3 us slower. Runs 2 and 3 (same, bounded; the gathers
sharing a destination): read_same within 0.1 of read on every row, read_bounded 0.5-0.7 faster at
1x131072, 64x2048 and 4x32768 (the wide rows) and within 0.1 elsewhere; gather_bounded 1.2-1.5
slower at the wide rows. The read's wide entry took the bound (kernels/index_k_read.py
WIDE_RESIDENT); the gather's did not. The same registers, a different schedule: the speed moved
opposite ways in the two entries, and the count of instructions between loads (fewer in both
bounded builds) does not predict it."""
import ctypes
import dataclasses
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/experiments/

import torch

import engine_entries as ee
import paged_batch as pb
from read_vs_gather import checked, layout_of, medians, read_on, rebuilt
from timing import check_same, flush_buffer, time_samples
from nvrtc_gather.integrations import sglang as hook
from nvrtc_gather.jit import driver, runtime, sources
from nvrtc_gather.kernels import gather as gather_spec
from nvrtc_gather.kernels import index_k_read as read_spec
from nvrtc_gather.ops import gather

REPS = int(os.environ.get("REPS", 400))
WORKLOADS = [(16, 2048), (64, 2048), (1, 131072), (1024, 256), (4096, 64), (2, 16384), (200, 300), (1, 16384),
             (1, 1000), (8, 100)]
WIDE_RESIDENT = read_spec.WIDE_RESIDENT  # main's read has it since these runs; the gather's wide does not
# each variant's value loop, in place of main's (main_loop)
STEP_LOOP = """\
    // fp8 values: vector i of the block's rows is token i / vpt, column i % vpt. This thread's
    // vectors are tid, tid + NG_THREADS, ...: its first (tok, col) divided once, then each next one
    // dt rows and dc columns on, a column past vpt carried into the row (no division a vector).
    const int vpt = head_dim / KVEC;
    const FastDiv by_vpt(vpt);
    int tok = by_vpt(tid), col = tid - tok * vpt;
    const int dt = by_vpt(NG_THREADS), dc = NG_THREADS - dt * vpt;  // dc < vpt
    while (tok < n) {  // vector i < n * vpt
        V v[UNROLL];
        i64 dst[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            dst[u] = -1;
            if (tok < n) {
                const int2 loc = s_loc[tok];
                if (loc.x >= 0) {
                    v[u] = __ldg(reinterpret_cast<const V*>(kv_cache + (i64)loc.x * block_stride +
                                                            (i64)loc.y * head_dim) + col);
                    dst[u] = (i64)(row0 + tok) * dst_k_row_stride + (i64)col * KVEC;
                } else if (ZERO_SKIPPED) {
                    v[u] = V();
                    dst[u] = (i64)(row0 + tok) * dst_k_row_stride + (i64)col * KVEC;
                }
            }
            tok += dt;
            col += dc;
            if (col >= vpt) {
                col -= vpt;
                ++tok;
            }
        }
"""
# "hoist": the step loop with its branch on the row's location written so
_COPIED_OR_ZERO = STEP_LOOP[STEP_LOOP.index("                if (loc.x >= 0) {"):
                            STEP_LOOP.index("            }\n            tok += dt;")]
_ONE_DESTINATION = """\
                if (loc.x >= 0 || ZERO_SKIPPED) {  // one destination computation for both
                    dst[u] = (i64)(row0 + tok) * dst_k_row_stride + (i64)col * KVEC;
                    v[u] = V();
                    if (loc.x >= 0) {
                        v[u] = __ldg(reinterpret_cast<const V*>(kv_cache + (i64)loc.x * block_stride +
                                                                (i64)loc.y * head_dim) + col);
                    }
                }
"""
HOIST_LOOP = STEP_LOOP.replace(_COPIED_OR_ZERO, _ONE_DESTINATION)
# name -> (value loop, {entry suffix: blocks an SM its __launch_bounds__ asks}); "same" is main
# rebuilt under another name (the A/A control for a build's own effect); "rows6": also the
# row-major entry ("" suffix; 40 registers, 6 blocks an SM fit) bounded; VARIANTS=name,... times a subset
BUILDS = {"same": (None, {}), "bounded": (None, {"_wide": WIDE_RESIDENT}),
          "rows6": (None, {"_wide": WIDE_RESIDENT, "": 6}),
          "step": (STEP_LOOP, {"_wide": WIDE_RESIDENT}), "hoist": (HOIST_LOOP, {"_wide": WIDE_RESIDENT})}
BUILDS = {k: v for k, v in BUILDS.items() if k in os.environ.get("VARIANTS", "bounded,step,hoist").split(",")}


_LOOP_START = "    // fp8 values: vector i of the block's rows"
_LOOP_END = "#pragma unroll\n        for (int u = 0; u < UNROLL; ++u) {\n            if (dst[u] >= 0)"


def main_loop(text: str) -> str:
    """tile_copy.cuh's value loop up to its stores (``text``: the header)."""
    assert text.count(_LOOP_START) == 1 and text.count(_LOOP_END) == 1, "main's tile copy changed: update the variants"
    return text[text.index(_LOOP_START):text.index(_LOOP_END)]


def variant_dir(loop: str | None, edit=None) -> str:
    """A copy of main's sources with tile_copy.cuh's value loop replaced by ``loop`` (None: main's)
    and then passed through ``edit`` (header text -> header text), the header written into the two
    sources that include it (NVRTC gets every header from cuda_src/)."""
    out = Path(tempfile.mkdtemp())
    for f in Path(sources.source_dir()).iterdir():
        shutil.copy(f, out / f.name)
    text = sources.read_source("tile_copy.cuh")
    header = text.replace(main_loop(text), loop or main_loop(text)).replace("#pragma once\n", "")
    header = edit(header) if edit else header
    for name in ("gather_indexer_k.cu", "index_k_read.cu"):
        src = (out / name).read_text()
        assert src.count('#include "tile_copy.cuh"\n') == 1, name
        (out / name).write_text(src.replace('#include "tile_copy.cuh"\n', header))
    return str(out)


def variant(modules: dict, name: str, source_dir: str | None, resident: dict) -> dict:
    """``modules`` built from ``source_dir`` (None: the package's cuda_src/) under their names +
    ``_name``, the entries named by ``resident`` (their suffix; "" the unsuffixed entry) bounded at
    its blocks an SM."""
    return {key: dataclasses.replace(m, name=f"{m.name}_{name}", source_dir=source_dir, entries=tuple(
        dataclasses.replace(e, min_blocks=resident.get(e.name[len(m.name):], e.min_blocks)) for e in m.entries))
        for key, m in modules.items()}


def registers(module, device: int) -> str:
    """Each entry's registers a thread, as the driver loaded it (CU_FUNC_ATTRIBUTE_NUM_REGS = 4)."""
    lib = ctypes.CDLL(driver.LIBRARY)
    handle = runtime.load(module, device, runtime.current_stream(device))
    out = []
    for name, function in handle.functions.items():
        n = ctypes.c_int()
        assert lib.cuFuncGetAttribute(ctypes.byref(n), 4, ctypes.c_void_p(function)) == 0
        out.append(f"{name} {n.value}")
    return ", ".join(out)


def main(workloads):
    flush, acc, p = flush_buffer(), ee.accessor(), ee.pool()
    dirs = {name: (variant_dir(loop), resident) for name, (loop, resident) in BUILDS.items()}
    reads = {f"read_{name}": variant(read_spec.MODULES, name, *d) for name, d in dirs.items()}
    gathers = {"gather": gather_spec.MODULES[16],
               **{f"gather_{name}": variant(gather_spec.MODULES, name, *d)[16] for name, d in dirs.items()}}
    print(torch.cuda.get_device_name(), torch.__version__, "SGLang:", "yes" if acc else "no", flush=True)
    for batch, mean in workloads:
        w = ee.Workload(batch, mean)
        fns = {"read": lambda: hook.get_index_k_scale_buffer(*w.get_args())}
        fns["read"]()
        layout = layout_of(w)
        for name, modules in reads.items():
            lay = rebuilt(layout, modules)
            fns[name] = read_on(lay, w)
        fns = checked(fns, w, acc, p)
        want = torch.cat(fns["read"](), 1)
        kv = w.buf.view(w.num_blocks, pb.BLOCK_SIZE, ee.RECORD)
        # one destination for every gather: a build's time, not where its outputs happen to lie
        k = torch.empty(w.tokens, 128, dtype=torch.uint8, device="cuda")
        s = torch.empty(w.tokens, 4, dtype=torch.uint8, device="cuda")
        for name, module in gathers.items():
            k.fill_(0xFF)
            s.fill_(0xFF)
            go = gather.prepared(kv, k.view(torch.float8_e4m3fn), s, w.block_table, w.cu, module=module)
            go()
            check_same(name, torch.cat((k, s), 1), want, w.name)
            fns[name] = go
        got = time_samples(fns, flush, REPS, order="shuffle")
        print(f"{w.name} (read: {layout.launch(w.tokens, w.longest)}): " + medians(got), flush=True)
        w = fns = layout = None
        torch.cuda.empty_cache()
    for module in (read_spec.MODULES[16, "i64", "i32"], *(m[16, "i64", "i32"] for m in reads.values()),
                   *gathers.values()):
        print(f"{module.name}: {registers(module, torch.cuda.current_device())}", flush=True)


if __name__ == "__main__":
    main([tuple(int(x) for x in a.split("x")) for a in sys.argv[1:]] or WORKLOADS)
