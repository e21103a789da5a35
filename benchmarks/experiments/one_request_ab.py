"""One request through the index-K read's request-major tiles (index_k_read_by_request with R =
1: block b copies tile b, its rows' page ids loaded beside the length) against the row-major
body's one-request path (index_k_read_body: the same single round trip, then the same copy),
through SGLang's entry, beside our gather, SGLang 0.5.23's Triton read (where it imports) and a
copy of the same bytes. Lengths int64, page ids int32, as SGLang passes them. Bytes checked
equal first; then REPS shuffled runs (timing.time_samples: L2 flushed, CUDA events), medians
and 25th-75th percentiles. "rows" and "rows_again" are the same launch twice (this run's A/A
gap); "req128": request-major tiles of 128 rows where the rule's are 256 (its wide tiles);
"req_u8": 256-row tiles with 8 loads in flight (an entry built here, __launch_bounds__(256, 4)).
On the rows of several requests "req" is the launch rule's own choice.

    [REPS=400] python3 benchmarks/experiments/one_request_ab.py [BxM ...]

Prediction (written before the run, with the request-major copy then writing no zero rows: each
zeroed by its own thread, NOTES v25's variant): 0.4-0.7 us off 1x131072 and 1x65536, 0-0.2 off
1x16384. Refuted (H100; NOTES.md, the fourteenth session of 2026-12-06): request-major lost on
every one-request row, by 1.3 us at 1x131072 (19.33 against 18.02-18.08; req128 19.07, req_u8
19.10), 0.45 at 1x65536 (same tiles and grid as the row-major ones), 0.3 at 1x16384, 0.1 at
1x4096; the copy without its zero branch moved request-major 0.13 us at 1x131072 and within
+-0.1 elsewhere. One request stays on the row-major body."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/experiments/

import torch

import engine_entries as ee
from by_request_ab import by_request, row_major, tile_rule, tile_variant
from read_vs_gather import checked, layout_of, medians, ours, read_on
from timing import flush_buffer, time_samples

REPS = int(os.environ.get("REPS", 400))
WORKLOADS = [(1, 131072), (1, 65536), (1, 16384), (1, 4096), (16, 2048), (2, 16384), (64, 512), (1024, 256)]


def main(workloads):
    flush, acc, p = flush_buffer(), ee.accessor(), ee.pool()
    print(torch.cuda.get_device_name(), torch.__version__, "SGLang:", "yes" if acc else "no", flush=True)
    for batch, mean in workloads:
        w = ee.Workload(batch, mean)
        fns = ours(w)  # "read": the launch rule's choice
        fns["read"]()
        layout = layout_of(w)
        lays = [("rows", row_major(layout)), ("rows_again", row_major(layout)), ("req", by_request(layout, batch))]
        if batch == 1 and tile_rule(layout)(w.tokens)[0] == 256:
            lays += [("req128", by_request(layout, batch, tpc=128)),
                     ("req_u8", tile_variant(layout, batch, 256, 8, 4))]
        for name, lay in lays:
            fns[name] = read_on(lay, w)
        got = time_samples(checked(fns, w, acc, p), flush, REPS, order="shuffle")
        print(f"{w.name} (rule: {layout.launch(w.tokens, w.longest)}): " + medians(got), flush=True)
        w = fns = layout = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main([tuple(int(x) for x in a.split("x")) for a in sys.argv[1:]] or WORKLOADS)
