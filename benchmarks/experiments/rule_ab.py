"""The index-K read's row-major entry bounded at 6 blocks an SM, and request-major tiles past one
wave, against the launch rule as shipped, on multi-wave calls of 2-256 requests (and a few
others), through SGLang's entry, beside SGLang 0.5.23's Triton read, our gather and a copy of the
same bytes. Lengths int64, page ids int32, max_seq_len the longest length, as SGLang passes them.
Bytes checked equal first; then REPS shuffled runs (timing.time_samples: L2 flushed, CUDA
events), medians and 25th-75th percentiles.

    [REPS=400] python3 benchmarks/experiments/rule_ab.py [BxM ...]

"read": the rule as shipped; "rows": its row-major tiles forced; "rows6": the same launch, the
row-major entry built with __launch_bounds__(256, 6) (its 40 registers allow 6; the wide entry at
WIDE_RESIDENT as shipped); "req": request-major tiles forced (the rule's rows a block, a block per
tile of the longest request for each request: past one wave of 5 blocks an SM where the requests
are long); "req_rows6": the same, from the rows6 build (the request-major entry is unchanged
there: an A/A pair with "req").

Prediction (written before the run, from copy_ab.py's run of this session, H100: rows6 0.25-0.5
us faster than the shipped row-major entry at 8x16384, 4096x64, 1024x256, the A/A within 0.05;
by_request_ab.py: request-major tiles 0.7 us faster than row-major at 8x16384, 1448 blocks, 1.3
waves, and 0.9 slower at 4x32768, where the rule picks the wide tiles): rows6 0.2-0.5 faster on
every row-major multi-wave row, within 0.1 elsewhere; request-major tiles faster than rows6 where
the requests are long (8x16384, 8x8192, 16x8192: thousands of rows a request, few partial
tiles), slower where they are short (200x300, 128x512: many partial tiles). Decision: land rows6
if no row is slower by more than 0.1; take request-major past one wave only for the shapes where
it beats rows6 by more than 0.2, with a rule stated in the requests' length in tiles.

Result (H100, NVRTC 13.0, one run of 400; NOTES v29 has the table): rows6 within 0.07 us of rows
on every row (copy_ab's gain did not repeat): not landed. Request-major tiles faster than the
row-major ones on every narrow-tile row of 2-200 requests, 0.22-0.77 us (8x16384 20.38 against
21.15; its grid is 2.2 waves of 5 blocks an SM, not the 1.3 written above), short requests
(200x300, 128x512) included against the prediction; slower in place of the wide tiles (0.7-1.0),
past 256 requests and for one request. So no rule in tiles a request: the launch rule
(kernels/index_k_read.py launch_rule) dropped its one-wave condition instead."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import torch

import engine_entries as ee
from by_request_ab import by_request, row_major
from copy_ab import variant
from read_vs_gather import checked, layout_of, medians, ours, read_on, rebuilt
from timing import flush_buffer, time_samples
from nvrtc_gather.kernels import index_k_read as spec

REPS = int(os.environ.get("REPS", 400))
WORKLOADS = [(8, 16384), (16, 8192), (8, 8192), (16, 4096), (32, 2048), (32, 4096), (64, 1024), (128, 512),
             (200, 300), (256, 512), (4, 16384), (1024, 256), (4096, 64), (1, 65536), (16, 2048), (2, 16384)]
# the row-major entry ("" suffix) bounded at 6 blocks an SM, main's sources under their own module names
ROWS6 = variant(spec.MODULES, "rows6", None, {"": 6})


def main(workloads):
    flush, acc, p = flush_buffer(), ee.accessor(), ee.pool()
    print(torch.cuda.get_device_name(), torch.__version__, "SGLang:", "yes" if acc else "no", flush=True)
    for batch, mean in workloads:
        w = ee.Workload(batch, mean)
        fns = ours(w)  # "read" (the rule's launch) and "gather"
        fns["read"]()  # its layout remembered
        layout = layout_of(w)
        six = rebuilt(layout, ROWS6)
        lays = {"rows": row_major(layout), "rows6": row_major(six), "req": by_request(layout, batch),
                "req_rows6": by_request(six, batch)}
        for name, lay in lays.items():
            fns[name] = read_on(lay, w)
        got = time_samples(checked(fns, w, acc, p), flush, REPS, order="shuffle")
        rule = layout.launch(w.tokens, w.longest)
        req_grid = spec.grid_by_request(batch, w.longest, rule[0])
        print(f"{w.name} (read: {rule}, max {w.longest}, req grid {req_grid}): "
              + medians(got), flush=True)
        w = fns = layout = six = lays = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main([tuple(int(x) for x in a.split("x")) for a in sys.argv[1:]] or WORKLOADS)
