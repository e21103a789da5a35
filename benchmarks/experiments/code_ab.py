"""Does the index-K read lose time to its own code? Its entries are 15-38 KB of sm_90 code (the
16-byte int64/int32 module: request-major 23.8 KB, the first value load 11 KB in; tiny 15.4;
wide 38.4; row-major 34.6), with a dozen inlined debug reports (ng_report: an atomicCAS and three
stores) and every size of the layout a run-time value. After the L2 flush (in an engine, after
the other kernels of a layer) that code comes from DRAM. Builds of the read, each timed through
SGLang's entry (the launch rule's entry) beside SGLang 0.5.23's Triton read and a copy of the
same bytes; lengths int64, page ids int32, as SGLang passes them. Bytes checked equal first; then
REPS shuffled runs (L2 flushed, CUDA events), medians and 25th-75th percentiles; then each build's
code size.

    [REPS=300] [BUILDS=same,noreport,const,lean] python3 benchmarks/experiments/code_ab.py [BxM ...]

"read": as shipped. "same": main's sources rebuilt under another name (A/A). "noreport": every
report compiled out (not shippable: debug mode reports nothing; the bound on what the reports'
code costs). "const": the read's layout fields page_size, head_dim and scale_words replaced by
SGLang's values (64, 128, 1: valid for that layout only, as Triton compiles its constexprs), so
ptxas folds their divisions and branches; "lean": const and noreport. "<build>_warm" (read,
lean) and "sglang_warm": timed after a launch of the same kernel between the flush and the timed
call (ours: this call's launch with 64 rows, into 64-row outputs; SGLang's: its Triton kernel
with the first request 64 long and the others empty), so its code is in the L2 and its data is
not.

Run 1 (H100, 300 runs; then "cold", each report an out-of-line __noinline__ call, in place of
const and lean). Prediction: if code fetch after the flush costs the read time, noreport is
0.2-0.5 us faster than same on the tile rows and read_warm gains more on read than sglang_warm on
SGLang's. Result: read_warm 0.13-0.39 us faster than read on the six tile rows (2x16384 0.26,
8x16384 0.13, 16x2048 0.18, 64x2048 0.29, 1x131072 0.35, 1024x256 0.39), 0.03 on the warp-a-row
rows; sglang_warm within 0.09 of sglang on the tile rows (0.16-0.19 faster on the small ones).
With its code warm the read ties or beats SGLang's warm read on every row but 8x16384 (0.28
behind). noreport: 0.0-0.16 faster on the tile rows (the reports are 6-8% of the code), 0.1
slower on the small ones; cold 0.2-0.5 slower on the request-major rows. So the code's fetch
costs the read, the reports are not most of it, and an out-of-line call costs more than it saves.

Run 2 (const, lean; code sizes sm_90, NVRTC 13.0, the 16-byte int64/int32 module: main req 23.8
KB, tiny 15.4, wide 38.4, row-major 34.6; const 15.5, 7.0, 29.2, 26.2; lean 14.5, 5.5, 26.8,
23.9). Prediction (written before the run): const and lean take 0.1-0.3 us off the tile rows and
lean's warm gain is under half of read's; a build that beats read by 0.2 on most rows is the
case for compiling the read per layout (NVRTC compiles at first use anyway: the layout's
fields become constants). Not run: the session's device time went to failed starts.

Run 3 (branch layout-constants: entries of the wide, tiny and request-major shapes built with
SGLang's layout as constants, launched for that layout; BUILDS= empty). Prediction (written before
the run): read 0.1-0.3 us faster than generic on the wide and request-major rows (2x16384, 8x16384,
16x2048, 64x2048, 1x131072), the two within 0.1 at 1024x256 (row-major: the same entry, an A/A
pair) and on the warp-a-row rows; read's warm gain smaller than generic's. Result (H100, 300
runs, medians read/generic us): 2x16384 10.32/10.40, 8x16384 21.12/20.72, 16x2048 9.50/9.57,
64x2048 17.50/17.50, 1x131072 17.07/17.31, 1024x256 31.57/31.58 (A/A), 1x1000 5.82/6.14, 8x100
5.76/6.02; warm, 8x16384 20.98/20.48 and 64x2048 17.66/17.22. So the tiny build is 0.26-0.32
faster cold and warm, the wide one ties or wins cold, and the request-major one loses 0.4 at
8x16384 with its code warm too: not the code's fetch. Its SASS spills (STACK 24: a local store before
the tile loop, a local load in it before each tile's copy) within the 48 registers its __launch_bounds__
allows, where the general build spills nothing; the general tiny build spills (STACK 8), the
constant-size one does not.

Run 4 (the request-major shape dropped from FIXED_SHAPES). Prediction: the request-major rows
(2x16384, 8x16384, 16x2048) and 1024x256 read within 0.1 of generic (the same entries), the tiny
rows 0.2-0.35 faster, the wide rows tie or better. With it, "req4" on the request-major rows (the
constant-size request-major entry at 4 blocks an SM, where at 5 it spilled: NOTES v32 section 2).
Prediction: req4 0.1-0.3 faster than generic at 2x16384 and 16x2048 (grids under one wave of
either bound), and within 0.2 of it at 8x16384 (1448 blocks: 2.2 waves of 5 blocks an SM, 2.7 of
4); a gain there as well is the case for shipping it with the request-major shape in
FIXED_SHAPES at its own bound. Result (H100, 300 runs, medians us; read / generic / req4 / SGLang,
then warm): 2x16384 10.21/10.21/10.06/9.98, warm 9.92/9.92/9.79/9.95; 8x16384 20.32/20.35/20.32/
20.13, warm 20.19/20.16/20.10/20.06; 16x2048 9.34/9.38/9.18/9.15, warm 9.25/9.22/9.02/9.22;
64x2048 17.23/17.28 (warm 17.33/17.12); 1x131072 16.86/17.09; 1024x256 31.07/31.10 (A/A);
1x1000 5.76/6.02; 8x100 5.70/5.92. The prediction held on every row (read against generic: the
tiny rows 0.22-0.26 faster, the wide ones 0.05 and 0.23, the request-major and row-major rows
within 0.04), and so the tiny and wide builds landed; req4 0.15 and 0.20 faster at 2x16384 and
16x2048, 0.03 at 8x16384 (also warm): kept as a patch until its GPU tests ran. Run 5 (H100, the
package with req4 as its request-major constant-size entry; read = req4 as an A/A pair): read
against generic 0.13/0.09/0.19 faster at 2x16384/8x16384/16x2048 (warm 0.18/0.12/0.29), SGLang
0.03/0.20/0.00 ahead of read; the whole GPU suite passed with it, and it landed (NOTES v35).

Run 6 ("rmconst" on the row-major rows: that entry built with the layout's constants, 26 KB of
sm_90 code against 34, its skip pass split into 3-4 round trips by ptxas; NOTES v37). Prediction
(written before the run): rmconst 0.1-0.3 us faster than read at 1024x256 and 4096x64 cold, the
two within 0.1 warm; should the split pass cost more than the smaller code saves, rmconst is
slower at 4096x64 (16 chunks: every block past the second skips) than at 1024x256. Result (H100,
300 runs, medians us; read / rmconst / SGLang / copy): 1024x256 31.57/31.42/31.14/30.54 (warm
read 31.34, rmconst 31.18); 4096x64 32.67/33.90/38.14/30.66: 0.15 faster at 1024x256 and 1.2
slower at 4096x64, where the split pass costs more than the smaller code saves. Not landed: one
row-major entry serves both (NOTES v38 section 1).
Run 7 ("reqbig" arms, on rows of more than THREADS requests, which the launch rule sends to the
row-major tiles: SGLang's Triton read is request-major there, a block of 256 positions per
request, and ahead of ours at 1024x256 by 0.2-0.45 us in runs 6 and v37's). "reqbig": the
shipped req_wide entry launched for them (THREADS rows a tile, grid_by_request); its lengths
before the request are summed one chunk of THREADS a round trip past the first. "reqbig_ld": the
same entry with those loads issued 4 chunks at a time (clamped, unconditional). "reqbig_pre": the
first 4 chunks' loads issued beside the request's own length and first page ids (one round trip
for up to 4 * THREADS requests). Prediction (written before the run): at 1024x256 reqbig within
0.2 of read (3 serial L2 round trips per block before its copy, hidden in part by the other
resident blocks), reqbig_pre 0.2-0.5 faster than read and level with SGLang; at 2048x128 and
4096x64 every reqbig arm slower than read (grids of 2048-4096 blocks of tiles mostly empty).
Result (H100, 300 runs, medians us; read / reqbig / reqbig_ld / reqbig_pre / SGLang / copy):
1024x256 31.30/31.20/31.36/32.70/31.04/31.02; 512x512 30.94/30.67/30.80/32.02/30.51/30.72; 2048x128
31.14/32.00/32.13/34.85/31.10/30.70; 4096x64 32.35/43.47/43.14/44.64/38.03/30.75. reqbig within 0.3
of read where the batch is 512-1024 and 0.9-11 us slower past it; reqbig_pre 1.1-2.8 us slower than
reqbig on every row (prediction refuted): its blocks load up to 4 chunks of lengths before the
early exit of a tile past its request's end, every block 8 KB of L2 reads at 1024 requests, and the
before-sum's L2 traffic grows with the square of the batch. Not landed (NOTES v38 section 3).
Run 8 ("rmkeep", the row-major rows): the row-major entry with skip_chunks handing each thread its
length in the chunk it found (the pass has them in registers), so the main scan does not load that
chunk again: a block past the first chunk waits on the first chunk's lengths, the pass, the page
ids and the copy, four round trips instead of five. Prediction (written before the run): rmkeep
0.1-0.3 us faster than read at 1024x256, 512x512, 2048x128 and 4096x64 (each block past the first
chunk one L2 round trip shorter; the first wave's latency is what shows), with no row slower by
more than 0.1 (the pass keeps 8-16 more registers live across its barriers). "rmfirst": rmkeep,
and in a batch of more than two chunks every block starts with the skip pass from chunk 0 (three
round trips before the copy, as SGLang's Triton read). Prediction: at 1024x256, 2048x128 and
4096x64 rmfirst 0.1-0.2 faster than rmkeep (its blocks in chunk 0 one round trip longer, the
others one shorter), level at 512x512. "rmfirst_smem": rmfirst with the pass's lengths kept in
shared memory (8 KB a block with int64 lengths, 16 KB with int32), the form that could land.
Prediction: within 0.1 of rmfirst on every row (a shared store per chunk; the extra shared memory
does not lower the 6 blocks an SM that the row-major entry's registers allow). "rmfirst_only": the
pass from chunk 0 without the kept lengths (experiments/read_first_pass.patch is this arm as it would
land; the kept lengths split the int32 entries' pass with NVRTC 13.5: NOTES v39 section 2; the
found chunk's lengths, loaded again, are the same block's L1 lines). Prediction: 0.1-0.3 faster
than read at 1024x256, 2048x128 and 4096x64, within 0.1 of rmfirst, level at 512x512 (no pass)."""
import dataclasses
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import torch

import engine_entries as ee
from copy_ab import variant
from read_vs_gather import checked, forced, layout_of, medians, read_on, rebuilt
from timing import flush_buffer, time_samples
from nvrtc_gather.integrations import sglang as hook
from nvrtc_gather.jit import compiler, runtime, sources
from nvrtc_gather.jit.spec import Entry
from nvrtc_gather.kernels import index_k_read as spec
from nvrtc_gather.ops import index_k_read

REPS = int(os.environ.get("REPS", 300))
WORKLOADS = [(2, 16384), (8, 16384), (16, 2048), (64, 2048), (1, 131072), (1024, 256), (1, 1000), (8, 100)]
# What follows the includes of index_k_read.cu in each build (ng_report is used only after them)
NOREPORT = "#define ng_report(err, code, a, b, c) ((void)0)\n"
# (after the includes, whole-file replacements)
REPORTS = {
    "same": ("", False),
    "noreport": (NOREPORT, False),
    "const": ("", True),
    "lean": (NOREPORT, True),
}
# SGLang's layout as constants (page_size 64, index_head_dim 128, one scale word): valid only for it
CONSTANTS = {"p.head_dim": "128", "p.scale_words": "1", "p.page_size": "64"}
ANCHOR = '#include "tile_copy.cuh"\n'
# timed with their code warm too, where built
WARM = ("read", "generic", "req4", "rmconst", "rmkeep", "rmfirst", "rmfirst_smem", "rmfirst_only", "lean")


def edited_dir(edits, everywhere: dict | None = None) -> str:
    """A copy of main's index_k_read.cu with each (old, new) of ``edits`` replaced (each found
    once), then each key of ``everywhere`` replaced by its value wherever it occurs (found at least
    once)."""
    out = Path(tempfile.mkdtemp())
    src = sources.read_source("index_k_read.cu")
    for old, new in edits:
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    for old, new in (everywhere or {}).items():
        assert old in src, old
        src = src.replace(old, new)
    (out / "index_k_read.cu").write_text(src)
    return str(out)


def build_dir(extra: str, constants: bool) -> str:
    """A copy of main's index_k_read.cu with ``extra`` after its includes, and with CONSTANTS."""
    return edited_dir(((ANCHOR, ANCHOR + extra),), CONSTANTS if constants else {})


# "req4" (rows the read launches request-major): the request-major entry built with the fixed
# layout's constants and bounded at 4 blocks an SM (64 registers, no spill; at 5 it spills:
# NOTES v32 section 2), launched in place of the general one; the other shapes as "read". Where
# the package has that entry itself (since NOTES v35) REQ4 is the package's modules and req4 an
# A/A pair with read.
REQ4 = spec.MODULES if "req" in spec.FIXED_SHAPES else {
    key: dataclasses.replace(m, name=f"{m.name}_req4", entries=m.entries + (Entry(
        m.name + spec.FIXED_TAG + "_req", spec._BODIES["req"].format(vec=key[0], lt=key[1], pt=key[2], fixed="true"), 4),))
    for key, m in spec.MODULES.items()}


# "rmconst" (rows the read launches row-major, shape ""): that entry built with the fixed layout's
# constants (the package has none: with them ptxas splits the skip pass's 16 length loads into 3-4
# round trips, sm_90 SASS, NOTES v37 section 2), launched in place of the general one. Whether its
# smaller code (26 KB against 34, sm_90) gains more after the L2 flush than the split pass costs.
RMCONST_SUFFIX = spec.FIXED_TAG + "_rm"
RMCONST = {key: dataclasses.replace(m, name=f"{m.name}_rmconst", entries=m.entries + (Entry(
    m.name + RMCONST_SUFFIX, spec._BODIES[""].format(vec=key[0], lt=key[1], pt=key[2], fixed="true"), 0),))
    for key, m in spec.MODULES.items()}


def with_entry(layout, modules: dict, shape: str, suffix: str):
    """``layout`` (the fixed one) built from ``modules``, launching their entry ``suffix`` for ``shape``."""
    lay = rebuilt(layout, modules)
    for vec in spec.VECTOR_WIDTHS:
        module = modules[(vec, *layout.types)]
        handle = runtime.load(module, layout.device, runtime.current_stream(layout.device))
        lay.launchers[vec, shape] = handle.launcher(spec.module_name(vec, *layout.types) + suffix, 0, layout.image)
    return lay


def with_req4(layout):
    """``layout`` (the fixed one) launching REQ4's request-major entry."""
    return with_entry(layout, REQ4, "req", spec.FIXED_TAG + "_req")


# "reqbig" (run 7): the req_wide entry launched for a batch of more than THREADS requests; its
# variants' edits of index_k_read_by_request's sum of the lengths before the request.
BEFORE_LOOP = ("    for (u32 r = tid + NG_THREADS; r < rq; r += NG_THREADS) before = min(before + "
               "length_of<LT, false>(p, r), cap);\n")
GROUPED_LOOP = """    for (u32 r0 = tid + FIRST; r0 < rq; r0 += 4 * NG_THREADS) {
        LT x[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) x[k] = load_now<LT>(p.seq_lens, (i64)min(r0 + k * NG_THREADS, rq - 1) * p.seq_lens_stride);
#pragma unroll
        for (int k = 0; k < 4; ++k)
            if (r0 + k * NG_THREADS < rq) before = min(before + checked_length(p, r0 + k * NG_THREADS, (i64)x[k]), cap);
    }
"""
X0 = "    const LT x0 = (u32)tid < rq ? load_now<LT>(p.seq_lens, (i64)tid * p.seq_lens_stride) : (LT)0;\n"
PRE_LOADS = """    LT xs[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) xs[k] = rq ? load_now<LT>(p.seq_lens, (i64)min((u32)tid + k * NG_THREADS, rq - 1) * p.seq_lens_stride) : (LT)0;
    const LT x0 = xs[0];
"""
PRE_SUM = """#pragma unroll
    for (int k = 1; k < 4; ++k)
        if ((u32)tid + k * NG_THREADS < rq) before = min(before + checked_length(p, tid + k * NG_THREADS, (i64)xs[k]), cap);
"""


REQBIG = {"reqbig": spec.MODULES,
          "reqbig_ld": variant(spec.MODULES, "reqbig_ld", edited_dir(
              ((BEFORE_LOOP, GROUPED_LOOP.replace("FIRST", "NG_THREADS")),)), {}),
          "reqbig_pre": variant(spec.MODULES, "reqbig_pre", edited_dir(
              ((X0, PRE_LOADS), (BEFORE_LOOP, PRE_SUM + GROUPED_LOOP.replace("FIRST", "4 * NG_THREADS")))), {})} \
    if os.environ.get("REQBIG", "1") == "1" else {}  # REQBIG=0: without them


def with_reqbig(layout, modules: dict, batch: int):
    """``layout`` (the fixed one) built from ``modules``, launching their req_wide entry for any batch."""
    lay = with_entry(layout, modules, "req_wide", spec.FIXED_TAG + "_req_wide")
    grid = lambda max_len: spec.grid_by_request(batch, max_len, spec.THREADS)  # noqa: E731
    return forced(lay, lambda rows, max_len: (spec.THREADS, "req_wide", grid(max_len)), lay.launchers)


# "rmkeep", "rmfirst", "rmfirst_smem", "rmfirst_only" (run 8): skip_chunks hands each thread its
# length in the chunk it found (``kept``, in registers or, smem, in shared memory: each thread its own
# N words, no barrier), and the scan takes it in place of loading that chunk again; "first": in a
# batch of more than two chunks (outside debug mode) every block starts with the pass from chunk 0,
# and the pass's second call site (after chunk 0) goes: it cannot run after the first. "rmfirst_only":
# the first pass without the kept lengths.
SECOND_SITE = """            // A block whose rows lie past the first chunk, in a batch of more than two: skip to its chunk
            // (s_inc is free until the next chunk rewrites it).
            if (c0 == NG_THREADS && !read_all && (u32)p.batch > 2 * NG_THREADS && carry <= (u32)row0)
                c0 = skip_chunks<LT>(p, (u32)row0, c0, s_inc, carry);
"""
FIRST_LOOP = "        for (u32 c0 = 0; c0 < (u32)p.batch;) {\n"


def first_pass(call: str) -> str:
    """The loop's head with the pass from chunk 0 before it (``call``: the pass's call)."""
    return ("        u32 c0 = 0;\n"
            "        if (!read_all && (u32)p.batch > 2 * NG_THREADS)\n"
            f"            c0 = {call};\n"
            "        for (; c0 < (u32)p.batch;) {\n")


FIRST_ONLY = (SECOND_SITE, ""), (FIRST_LOOP, first_pass("skip_chunks<LT>(p, (u32)row0, 0, s_inc, carry)"))


def kept_edits(smem: bool, first: bool) -> tuple:
    keep_arg = " s_keep," if smem else ""
    edits = [
        ("u32* s, u32& carry) {", f"u32* s,{' u32* keep,' if smem else ''} u32& carry, u32& kept) {{"),
        ("        u32 carry = 0;  // rows",
         "        u32 kept = 0, kept_at = 0xffffffffu;\n        u32 carry = 0;  // rows"),
        ("const u32 len = c0 ? length_of<LT, false>(p, r)",
         "const u32 len = c0 == kept_at ? kept : c0 ? length_of<LT, false>(p, r)"),
        (SECOND_SITE, "") if first else
        ("                c0 = skip_chunks<LT>(p, (u32)row0, c0, s_inc, carry);\n",
         f"                c0 = kept_at = skip_chunks<LT>(p, (u32)row0, c0, s_inc,{keep_arg} carry, kept);\n"),
    ]
    if smem:
        edits += [
            ("lo[k] <= 0x7fffffffu ? lo[k] : 0u;\n",
             "lo[k] <= 0x7fffffffu ? lo[k] : 0u;\n            keep[k * NG_THREADS + threadIdx.x] = t;\n"),
            ("        __syncthreads();\n        return found;\n",
             "        kept = keep[k * NG_THREADS + threadIdx.x];\n        __syncthreads();\n        return found;\n"),
            ("    __shared__ int s_win[NG_THREADS];",
             "    __shared__ u32 s_keep[SkipChunks<LT>::N * NG_THREADS];\n    __shared__ int s_win[NG_THREADS];")]
    else:
        edits += [
            ("        u32 lo[N], hi[N];\n", "        u32 lo[N], hi[N], v[N];\n"),
            ("lo[k] <= 0x7fffffffu ? lo[k] : 0u;\n", "lo[k] <= 0x7fffffffu ? lo[k] : 0u;\n            v[k] = t;\n"),
            ("        __syncthreads();\n        return found;\n",
             "#pragma unroll\n        for (int kk = 0; kk < N; ++kk) if (kk == k) kept = v[kk];\n"
             "        __syncthreads();\n        return found;\n")]
    if first:
        call = f"kept_at = skip_chunks<LT>(p, (u32)row0, 0, s_inc,{keep_arg} carry, kept)"
        edits.append((FIRST_LOOP, first_pass(call)))
    return tuple(edits)


KEPT = {name: variant(spec.MODULES, name, edited_dir(edits), {})
        for name, edits in (("rmkeep", kept_edits(False, False)), ("rmfirst", kept_edits(False, True)),
                            ("rmfirst_smem", kept_edits(True, True)), ("rmfirst_only", FIRST_ONLY))}


BUILDS = {name: variant(spec.MODULES, name, build_dir(*REPORTS[name]), {})
          for name in os.environ.get("BUILDS", ",".join(REPORTS)).split(",") if name}


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


def warm_launches(w, layouts: dict, acc, p) -> dict:
    """name -> a launch of that function's kernel on 64 rows (name_warm for each layout in
    ``layouts``: the launch this call's rule picks, its entry and grid, through the same _run) or
    with one 64-long request and the rest empty (sglang_warm), run between the flush and the timed
    call."""
    n, longest = min(64, w.tokens), w.longest
    out = {}
    for name, layout in layouts.items():
        warm = forced(layout, lambda rows, max_len, call=layout.launch(w.tokens, longest): call, layout.launchers)
        out[f"{name}_warm"] = lambda warm=warm: index_k_read._run(warm, w.buf, w.lens_t, w.block_table, n, longest)
    if acc:
        lens = torch.zeros_like(w.lens_t)
        lens[0] = n
        out["sglang_warm"] = lambda: acc.GetKAndS.triton(p, w.buf, w.block_table, lens, n, n)
    return out


def main(workloads):
    flush, acc, p = flush_buffer(), ee.accessor(), ee.pool()
    print(torch.cuda.get_device_name(), torch.__version__, "SGLang:", "yes" if acc else "no", flush=True)
    for batch, mean in workloads:
        w = ee.Workload(batch, mean)
        fns = {"read": lambda: hook.get_index_k_scale_buffer(*w.get_args())}
        fns["read"]()  # its layout remembered
        layout = layout_of(w)
        lays = {"read": layout}
        rule = layout.launch(w.tokens, w.longest)
        shape = rule[1]
        if layout.fixed:  # "generic": the same layout launching its general entries (FIXED_TAG-less), by
            # the general launch rule (req_wide has a constant-size entry only)
            sm = torch.cuda.get_device_properties(layout.device).multi_processor_count
            lays["generic"] = layout._replace(fixed=False, launch=spec.launch_rule(layout.head_dim, sm, batch),
                                              launchers={}, calls={})
            if shape == "req":
                lays["req4"] = with_req4(layout)
            if shape == "":
                lays.update({name: rebuilt(layout, modules) for name, modules in KEPT.items()})
                lays["rmconst"] = with_entry(layout, RMCONST, "", RMCONST_SUFFIX)
            if batch > spec.THREADS:
                lays.update({name: with_reqbig(layout, modules, batch) for name, modules in REQBIG.items()})
        lays.update({name: rebuilt(layout, modules) for name, modules in BUILDS.items()})
        for name, lay in lays.items():
            if name != "read":
                fns[name] = read_on(lay, w)
        fns = checked(fns, w, acc, p)
        pre = warm_launches(w, {k: lays[k] for k in WARM if k in lays}, acc, p)
        fns.update({name: fns[name.removesuffix("_warm")] for name in pre})  # timed as itself, after its pre
        got = time_samples(fns, flush, REPS, order="shuffle", pre=pre)
        print(f"{w.name} (read: {rule}): " + medians(got), flush=True)
        w = fns = layout = pre = None
        torch.cuda.empty_cache()
    for name, modules in {"main": spec.MODULES, "req4": REQ4, "rmconst": RMCONST, **KEPT, **REQBIG, **BUILDS}.items():
        print(f"{name}: {code_sizes(modules[(16, 'i64', 'i32')])}", flush=True)


if __name__ == "__main__":
    main([tuple(int(x) for x in a.split("x")) for a in sys.argv[1:]] or WORKLOADS)
