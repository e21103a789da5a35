"""SGLang's index-K read against the indexer gather on the same rows, for Nsight Compute: where the
read's extra ~9 µs at 4096 requests of 64 tokens goes (NOTES.md v21: neither its lengths' round
trips nor its scan's instructions). Each workload's read (as SGLang's entry calls it) and gather
(given cu_seq_lens), checked byte-equal first, then each launched REPS times.

    ncu --clock-control none --csv --print-units base --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \\
        --kernel-name regex:'index_k_read|gather_indexer' \\
        python3 benchmarks/experiments/profile_read.py [BxM ...] > ncu_read.csv

Default workloads: 4096x64 (the slow row), 2048x128 and 1024x256 (the same bytes, fast)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

WORKLOADS = [(4096, 64), (2048, 128), (1024, 256)]
REPS = 5


def main(workloads) -> None:
    import torch

    import engine_entries as ee
    import paged_batch as pb
    import nvrtc_gather as ng
    from nvrtc_gather.integrations import sglang as hook
    for batch, mean in workloads:
        w = ee.Workload(batch, mean)
        kv = w.buf.view(w.num_blocks, pb.BLOCK_SIZE, ee.RECORD)

        def gather():
            k = torch.empty(w.tokens, 128, dtype=torch.uint8, device="cuda")
            s = torch.empty(w.tokens, 4, dtype=torch.uint8, device="cuda")
            ng.cp_gather_indexer_k_quant_cache(kv, k.view(torch.float8_e4m3fn), s, w.block_table, w.cu)
            return k, s

        def read():
            return hook.get_index_k_scale_buffer(*w.get_args())
        got, want = torch.cat(read(), 1), torch.cat(gather(), 1)
        assert torch.equal(got, want), f"{w.name}: the read and the gather differ"
        for fn in (read, gather):
            for _ in range(REPS):
                fn()
        torch.cuda.synchronize()
        print(f"{w.name}: read and gather x {REPS}", file=sys.stderr)


if __name__ == "__main__":
    args = sys.argv[1:]
    main([tuple(int(x) for x in a.split("x")) for a in args] if args else WORKLOADS)
