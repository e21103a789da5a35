"""A timing-only diagnostic build of the indexer gather: the op's own source
(cuda_src/gather_indexer_k.cu, read at run time so that it always measures the current kernel)
with its 16 KiB-block kernels' index work (request search, cu_seq_lens and block_table loads,
checks) removed; each row's block id comes from the row, spread over the cache. Its time beside
the op's is what the dependent index loads cost on one-wave calls (benchmarks/NOTES.md). Not a
correct gather: the driver times a source named diag_* without checking it.

    PYTHONPATH=. python benchmarks/experiments/no_index_loads.py DIR   (writes DIR/diag_no_index_loads.cu)
    PYTHONPATH=. python benchmarks/bench.py OUT --families indexer --skip-quant \\
        --gather-variant-source DIR/diag_no_index_loads.cu --workloads 1x131072,8x131072"""
import sys
from pathlib import Path

from nvrtc_gather.jit import sources
from nvrtc_gather.kernels import gather as gather_kernels

# The index phase of gather_body, between these two comment lines of the op's source.
INDEX_PHASE = ("    // Everything up to the barrier is independent", "    // Scales first:")
NO_INDEX_LOADS = '''    // DIAGNOSTIC: no index loads. Each row's block id comes from the row itself, spread over
    // the cache by a multiplicative hash; the copy phase below is the op's.
    if (tid < n) {
        const int row = row0 + tid;
        const int j = row / p.block_size;
        s_loc[tid] = make_int2((int)(((u32)j * 2654435761u) % (u32)p.num_blocks), row - j * p.block_size);
    }
    __syncthreads();

'''


def diagnostic_source() -> str:
    """The op's gather source with its index phase replaced."""
    text = sources.read_source(gather_kernels.MODULES[16].source)
    start, end = (text.find(anchor) for anchor in INDEX_PHASE)
    if start < 0 or end < start:
        raise RuntimeError(f"{gather_kernels.MODULES[16].source}: the index phase's comment lines moved "
                           f"({INDEX_PHASE}); update {__file__}")
    return text[:start] + NO_INDEX_LOADS + text[end:]


if __name__ == "__main__":
    out = Path(sys.argv[1]) / "diag_no_index_loads.cu"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(diagnostic_source(), encoding="utf-8")
    print(out)
