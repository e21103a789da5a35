"""Timing-only diagnostic builds of the gather, for ``bench.py --gather-diagnostic NAME``: the
op's own source (cuda_src/gather_indexer_k.cu) with one part replaced, generated at run time so
that it always measures the current kernel. A diagnostic is not a correct gather: bench.py times
it beside the op without checking it (its module name starts with ``variant_diag_``).

- ``no_index_loads``: the 16 KiB-block kernels without their index work (request search,
  cu_seq_lens and block_table loads, checks); each row's block id comes from the row, spread
  over the cache. Its time beside the op's is what the dependent index loads cost on one-wave
  calls (benchmarks/NOTES.md, v14). The tiny kernel is the op's."""
from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from nvrtc_gather.jit import sources
from nvrtc_gather.jit.spec import KernelModule
from nvrtc_gather.kernels import gather as gather_kernels

# The index phase of gather_body, between these two comment lines of the op's source.
_INDEX_PHASE = ("    // Everything up to the barrier is independent", "    // Scales first:")
_NO_INDEX_LOADS = '''    // DIAGNOSTIC: no index loads. Each row's block id comes from the row itself, spread over
    // the cache by a multiplicative hash; the copy phase below is the op's.
    if (tid < n) {
        const int row = row0 + tid;
        const int j = row / p.block_size;
        s_loc[tid] = make_int2((int)(((u32)j * 2654435761u) % (u32)p.num_blocks), row - j * p.block_size);
    }
    __syncthreads();

'''
DIAGNOSTICS = {"no_index_loads": _NO_INDEX_LOADS}


def diagnostic_source(name: str) -> str:
    """The op's gather source with its index phase replaced by diagnostic ``name``'s."""
    text = sources.read_source(gather_kernels.MODULES[16].source)
    start, end = (text.find(anchor) for anchor in _INDEX_PHASE)
    if start < 0 or end < start:
        raise RuntimeError(f"{gather_kernels.MODULES[16].source}: the index phase's comment lines moved "
                           f"({_INDEX_PHASE}); update benchmarks/diagnostics.py")
    return text[:start] + DIAGNOSTICS[name] + text[end:]


def diagnostic_module(name: str) -> KernelModule:
    """The op's 16-byte gather module built from diagnostic_source(name) (a temporary file)."""
    folder = Path(tempfile.mkdtemp(prefix="nvrtc_gather_diag_"))
    (folder / f"diag_{name}.cu").write_text(diagnostic_source(name), encoding="utf-8")
    return dataclasses.replace(gather_kernels.MODULES[16], name=f"variant_diag_{name}", source=f"diag_{name}.cu",
                               source_dir=str(folder))
