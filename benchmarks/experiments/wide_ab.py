"""The indexer gather's one-wave rows (wide entries): read 1.03-1.18x the copy since v19 against
the record's 0.91-1.08x. A/B in one run: the op; the op's source as of the record (2460a54,
old_gather/, before copy_tile); the op on the record's workload construction (CUDA randperm)."""
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch

import indexer
from timing import check_same, copy_fn, flush_buffer, l2_bytes, time_samples
from nvrtc_gather.kernels import gather as spec
from nvrtc_gather.ops import gather

OLD = dataclasses.replace(spec.MODULES[16], name="gather_indexer_k_old_v16",
                          source_dir=str(Path(__file__).resolve().parent / "old_gather"))

for batch, mean in ((1, 131072), (4, 32768), (64, 2048), (256, 1000), (1, 1000)):
    w = indexer.GatherWorkload(batch, mean, l2_bytes(), seed=batch * 7 + mean)
    k, s = w.outputs()
    k2, s2 = w.outputs()
    fns = {"op": gather.prepared(*w.args(k, s)), "old": gather.prepared(*w.args(k2, s2), module=OLD)}
    fns["op"](), fns["old"]()
    check_same("old", torch.cat([k2.view(torch.uint8), s2], 1), torch.cat([k.view(torch.uint8), s], 1), w.name)
    # the record's workload construction: blocks drawn by CUDA's randperm
    ids = torch.randperm(w.num_blocks, device="cuda")[:sum(w.blocks_per)].to(torch.int32).cpu()
    bt, i = torch.zeros_like(w.block_table).cpu(), 0
    for r, nb in enumerate(w.blocks_per):
        bt[r, :nb] = ids[i:i + nb]
        i += nb
    k3, s3 = w.outputs()
    fns["op_cuda_perm"] = gather.prepared(w.kv, k3, s3, bt.cuda(), w.cu)
    fns["copy"] = copy_fn(w.bytes_moved)
    got = {n: statistics.median(x) for n, x in time_samples(fns, flush_buffer(), 60 if w.tokens > 10000 else 200).items()}
    print(f"{w.name}: copy {got['copy']:.1f}  " + "  ".join(f"{n} {got[n]:.1f} ({got[n] / got['copy']:.2f}x)"
                                                       for n in ("op", "old", "op_cuda_perm")), flush=True)
