"""The index-K read (cuda_src/index_k_read.cu) against a variant whose rows without a location are
zeroed by their own thread before the copy, so the copy has no zero branch, as the gather's
(zero_rows_dir: main's source with that change, built at start), and against main's read with its
preferred shared-memory carve-out set ("carve0", "carve14"), in one process, beside our gather on
the same rows, SGLang 0.5.23's Triton read (where it imports) and a copy of the same bytes. Lengths
int64 and page ids int32, as SGLang passes them. Bytes checked equal first; then 200 interleaved
runs (timing.time_samples: L2 flushed, CUDA events), medians and 25th-75th percentiles.

    python3 benchmarks/experiments/read_zero_rows/ab.py [BxM ...]

NOTES v25 (H100, three runs): the variant took 1x131072 0.4-0.7 us under main's read (17.49-17.78
against 17.95-18.30; the gather 17.15-17.63, SGLang 17.79-17.98) and left the rows of several
requests where they were. Not landed: with NVRTC 13.5 its int32-lengths / int64-ids wide entry
spills 16 bytes and ptxas splits that entry's skip pass (tests/jit/test_sass_order.py). The
carve-out variants refuted the SM's shared-memory reconfiguration as the read's event-timed gap
over the gather (carve14 timed as main; carve0 cut occupancy)."""
import dataclasses
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/experiments/

import torch

import engine_entries as ee
from read_vs_gather import checked, layout_of, medians, ours, read_on, rebuilt
from timing import flush_buffer, time_samples
from nvrtc_gather.jit import sources
from nvrtc_gather.kernels import index_k_read as spec

WORKLOADS = [(1, 131072), (1, 16384), (16, 2048), (64, 2048), (128, 1024), (256, 512), (1024, 256), (4096, 64)]
_ZERO_ROW = """// Output row `row` as zeros: its fp8 values in KVEC-byte vectors, then its scale words.
template <int KVEC>
__device__ __forceinline__ void zero_row(const IndexKReadParams& p, int row) {
    typedef typename Vec<KVEC>::T V;
    V* dst = reinterpret_cast<V*>(p.dst_k + (i64)row * p.dst_k_row_stride);
    for (int c = 0; c < p.head_dim / KVEC; ++c) dst[c] = V();
    u32* sdst = reinterpret_cast<u32*>(p.dst_scale + (i64)row * p.dst_scale_row_stride);
    for (int w = 0; w < p.scale_words; ++w) sdst[w] = 0u;
}

"""


def zero_rows_dir() -> str:
    """A directory holding the variant: main's cuda_src/index_k_read.cu with every row without a
    location zeroed by its own thread before the barrier and the copy the gather's (no zero branch)."""
    src = sources.read_source("index_k_read.cu")
    body = "template <int KVEC, int UNROLL, typename LT, typename PT>\n__device__ __forceinline__ void index_k_read_body("
    copy = "    __syncthreads();\n    copy_tile<KVEC, UNROLL, true>("
    assert src.count(body) == 1 and src.count(copy) == 1, "main's read changed: update the variant"
    src = src.replace(body, _ZERO_ROW + body).replace(
        copy, "    if (tid < n && s_loc[tid].x < 0) zero_row<KVEC>(p, row);\n"
              "    __syncthreads();\n    copy_tile<KVEC, UNROLL, false>(")
    out = Path(tempfile.mkdtemp()) / "index_k_read_zero_rows.cu"
    out.write_text(src)
    return str(out.parent)


VARIANTS = {"zero_rows": {key: dataclasses.replace(m, name=f"{m.name}_zero_rows", source="index_k_read_zero_rows.cu",
                                                   source_dir=zero_rows_dir()) for key, m in spec.MODULES.items()}}
# main's read under its own module name, its kernels' preferred shared-memory carve-out set (percent
# of the most shared memory; 0: the most L1): ncu showed the read's wide entry run with a 64 KiB
# carve-out and the gather's with 32 KiB, kernel times equal at 1x131072, event times 0.8 us apart.
CARVEOUTS = {"carve0": 0, "carve14": 14}
VARIANTS.update({name: {key: dataclasses.replace(m, name=f"{m.name}_{name}") for key, m in spec.MODULES.items()}
                 for name in CARVEOUTS})


def _set_carveout(handle, percent: int) -> None:
    import ctypes
    from nvrtc_gather.jit import driver
    lib = ctypes.CDLL(driver.LIBRARY)
    for function in handle.functions.values():  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 9
        rc = lib.cuFuncSetAttribute(ctypes.c_void_p(function), 9, percent)
        assert rc == 0, f"cuFuncSetAttribute: {rc}"


def variant(layout, name):
    """The layout with every launcher built from variant ``name``'s source."""
    carve = CARVEOUTS.get(name)
    return rebuilt(layout, VARIANTS[name], None if carve is None else lambda handle: _set_carveout(handle, carve))


def main(workloads):
    flush, acc, p = flush_buffer(), ee.accessor(), ee.pool()
    print(torch.cuda.get_device_name(), torch.__version__, "SGLang:", "yes" if acc else "no")
    for batch, mean in workloads:
        w = ee.Workload(batch, mean)
        fns = ours(w)  # "read" (int64 lengths, as SGLang's) and "gather"
        fns["read"]()  # its layout remembered
        layout = layout_of(w)
        for name in VARIANTS:
            old = variant(layout, name)
            fns[name] = read_on(old, w)
        got = time_samples(checked(fns, w, acc, p), flush, 200)
        print(f"{w.name} (rows a block, shape: {layout.launch(w.tokens, w.longest)}): " + medians(got), flush=True)
        w = fns = old = layout = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main([tuple(int(x) for x in a.split("x")) for a in sys.argv[1:]] or WORKLOADS)
