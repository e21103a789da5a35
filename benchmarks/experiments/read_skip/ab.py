"""The index-K read with skip_chunks (the branch: a block past the first chunk of a large batch sums
16 chunks of lengths a round trip, then scans from its own chunk) against main's read
(index_k_read_before.cu), in one process, beside our gather on the same rows, SGLang 0.5.23's
Triton read (where it imports) and a copy of the same bytes. Lengths int64, as SGLang's
forward_batch.seq_lens are (engine_entries.Workload), and int32 (the record's rows until v22). Bytes checked equal first;
then 200 interleaved runs (timing.time_samples: L2 flushed, CUDA events), medians.

    python3 benchmarks/experiments/read_skip/ab.py [BxM ...]

Prediction (NOTES v22): where the read's extra time at 4096 requests is its chunk loop's serial
round trips (up to 16 a block, each with three barriers), 4096x64 drops from ~40 us to the
gather's ~31; where it is the lengths' L2 traffic, it grows (every skipping block reads all
4,096 lengths: ~32 MB instead of ~18). Rows of <= 512 requests never skip: unchanged."""
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/experiments/

import torch

import engine_entries as ee
from read_vs_gather import ours
from timing import check_same, copy_fn, flush_buffer, time_samples
from nvrtc_gather.integrations import sglang as hook
from nvrtc_gather.jit import runtime
from nvrtc_gather.kernels import index_k_read as spec
from nvrtc_gather.ops import index_k_read

WORKLOADS = [(4096, 64), (2048, 128), (1024, 256), (300, 800), (64, 2048), (8, 100)]
BEFORE = {key: dataclasses.replace(m, name=m.name + "_before", source="index_k_read_before.cu",
                                   source_dir=str(Path(__file__).resolve().parent))
          for key, m in spec.MODULES.items()}


def before(layout):
    """The layout with every launcher built from main's source."""
    launchers = {}
    for vec in spec.VECTOR_WIDTHS:
        handle = runtime.load(BEFORE[(vec, *layout.types)], layout.device, runtime.current_stream(layout.device))
        for shape in spec.SHAPES:
            launchers[vec, shape] = handle.launcher(spec.entry_name(vec, *layout.types, shape), 0, layout.image)
    return layout._replace(launchers=launchers)


def main(workloads):
    flush, acc, p = flush_buffer(), ee.accessor(), ee.pool()
    print(torch.cuda.get_device_name(), torch.__version__, "SGLang:", "yes" if acc else "no")
    for batch, mean in workloads:
        w = ee.Workload(batch, mean)
        fns = ours(w)  # "read" (int64 lengths, as SGLang's) and "gather"
        want = torch.cat(fns["read"](), 1)
        lens32 = w.lens_t.to(torch.int32)
        args32 = (w.buf, lens32, w.block_table, w.tokens, max(w.lens))
        fns["read i32"] = lambda: hook.get_index_k_scale_buffer(*args32)
        fns["read i32"]()
        for lens, name in ((w.lens_t, "before"), (lens32, "before i32")):
            old = before(index_k_read._layouts.get(index_k_read._key(w.buf, lens, w.block_table, 64, 128, 128)))
            fns[name] = lambda old=old, lens=lens: index_k_read._run(old, w.buf, lens, w.block_table, w.tokens)
        if acc:
            fns["sglang"] = lambda: acc.GetKAndS.triton(p, w.buf, w.block_table, w.lens_t, *w.get_args()[3:])
        for name in list(fns)[1:]:
            check_same(name, torch.cat(fns[name](), 1), want, w.name)
        fns["copy"] = copy_fn(w.moved)
        got = time_samples(fns, flush, 200)
        tile = index_k_read._layouts.get(index_k_read._key(w.buf, w.lens_t, w.block_table, 64, 128, 128)).shape(w.tokens)
        print(f"{w.name} (rows a block, shape: {tile}): "
              + "  ".join(f"{k} {statistics.median(v):.2f}" for k, v in got.items()), flush=True)
        w = fns = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main([tuple(int(x) for x in a.split("x")) for a in sys.argv[1:]] or WORKLOADS)
