"""The index-K read's request-major tiles (index_k_read_by_request: a block per tile of one
request, its page ids loaded beside the lengths) against its row-major tiles (index_k_read_body:
a block per run of destination rows, a scan of the lengths to find each row's request) on the
same calls, through SGLang's entry, beside our gather, SGLang 0.5.23's Triton read (where it
imports) and a copy of the same bytes. "rows" and "rows_again" are the same row-major launch
twice: their gap is this run's A/A floor. Lengths int64, page ids int32, as SGLang passes them;
max_seq_len the longest length, as SGLang passes it. Bytes checked equal first; then 200
interleaved runs (timing.time_samples: L2 flushed, CUDA events), medians and 25th-75th
percentiles.

    [REPS=200] [ORDER=rotate|shuffle] [TILES=1] python3 benchmarks/experiments/by_request_ab.py [BxM ...]

Prediction (written before the first run): the row-major tile waits, after the lengths' round
trip, for a block-wide scan (two barriers, shuffles, a bounded search) and, for a row whose page
column is past the window of page ids loaded with the lengths, a second round trip for its page
id; the request-major tile loads its rows' page ids with the lengths and scans nothing, so each
row's bytes are two round trips from the start. Expected 0.3-0.6 us off 16x2048 (9.6 -> ~9.1,
below SGLang's ~9.3) and 0.2-0.6 us off 64x2048, 128x1024, 256x512 and 200x300; the risk is
its grid: ceil(max_seq_len / tile) blocks a request, ~1.5x the row-major grid with these
lengths (0.5x-1.5x the mean), the surplus blocks exiting after the lengths' round trip.
Decision (before the run): keep the request-major tiles where their median beats the row-major
one by more than this run's A/A gap and 0.1 us; narrow the launch rule where they lose.

First run (H100, the rule then: every 2-256 request call not tiny): request-major faster by
0.16-0.42 us at 2x16384, 4x8192 and 32x512, even at 16x2048 (9.66 against 9.71-9.73), slower by
0.2-0.6 us at 64x2048, 128x1024, 256x512 (wide tiles) and 200x300. Its entries had 48 and 76
registers (5 and 3 blocks an SM, against 6 and 4 of the row-major ones): the losing rows' grids
(768, 800 blocks) took two waves, the winning ones' (326-448) one. Now `req` and `req_free` time
the request-major tiles with and without __launch_bounds__ (40/64 registers, 16-32 bytes of stack
in the 16-byte entries; 48/76), whatever the rule picks. Prediction for the second run: the bounded
entries within 0.1 us of the free ones where both fit one wave, up to 0.3 us faster where only
they do; the rule now takes request-major only where its grid fits one wave (16x2048, 4x8192,
2x16384, 32x512 here), so "read" there is "req" and elsewhere "rows".

Tiles run (NOTES v35; SGLang's layout, so constant-size entries; sm_90 NVRTC 13.5 registers:
u4 at 4 blocks 64, no spill; u8 at 3 blocks 80; u16 at 2 blocks 128): TILE_LIST="128,4,4 256,4,4
256,8,3 512,16,2" against the shipped read (req4: 128 rows, 4 loads in flight, 4 blocks an SM)
at 8x16384 2x16384 16x2048 4x32768. SGLang's Triton read, 0.2 us ahead at 8x16384, runs a
program per 256 tokens of a request with 16 loads in flight a thread, about one wave. Prediction
(before the run): t128u4 an A/A pair with read (within 0.1); at 8x16384 (1448 blocks of 128
rows: 2.7 waves of 4 an SM) the 256- and 512-row tiles (724 and 362 blocks: 1.4-1.8 waves) within
0.3 of read either way, a gain there only from the shorter tail; at 2x16384 and 16x2048 (grids of
326 and 432 blocks, under one wave) the larger tiles 0.2-1 slower (163-216 blocks: SMs left
idle); 4x32768 (the rule's wide tiles) read ahead of every request-major variant. Result (H100,
300 shuffled runs, medians us; read / req / t128u4 / t256u4 / t256u8 / SGLang; 512-row tiles
cannot run: the tile's page ids live in NG_THREADS slots of shared memory, so tiles are at most
256 rows, and that arm faulted): 8x16384 20.50/20.29/20.42/21.09/20.16/19.97; 2x16384
10.11/10.05/10.05/10.37/10.08/9.98; 16x2048 9.25/9.18/9.18/9.57/9.15/9.12; 4x32768 (read wide)
17.57/18.37/18.18/18.37/18.14/17.34. The A/A group (read, req, t128u4: one entry) spans 0.21 at
8x16384; t256u8 0.13-0.34 below it there, a tie elsewhere; t256u4 0.3-0.6 slower everywhere. No
variant reaches SGLang's Triton read at 8x16384 (t256u8 0.19 behind): nothing landed."""
import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import torch

import engine_entries as ee
from read_vs_gather import checked, forced, layout_of, medians, ours, read_on, rebuilt
from timing import check_same, flush_buffer, time_samples
from nvrtc_gather.jit import runtime
from nvrtc_gather.jit.spec import Entry
from nvrtc_gather.kernels import index_k_read as spec

REPS, ORDER = int(os.environ.get("REPS", 200)), os.environ.get("ORDER", "rotate")  # time_samples' runs and order
# TILES=1: request-major tiles of other sizes, TILE_LIST's "rows,loads in flight,blocks an SM" each
TILES = os.environ.get("TILES") == "1"
TILE_LIST = [tuple(int(x) for x in t.split(",")) for t in os.environ.get("TILE_LIST", "128,4,5 256,4,5 256,8,3").split()]
WORKLOADS = [(16, 2048), (64, 2048), (128, 1024), (256, 512), (200, 300), (4, 8192), (2, 16384), (32, 512),
             (1024, 256)]


def tile_rule(layout):
    """The layout's row-major tile rule (shape_rule) on this GPU: rows -> (rows a block, shape)."""
    return spec.shape_rule(layout.head_dim, torch.cuda.get_device_properties(0).multi_processor_count)


def row_major(layout):
    """``layout`` launching its row-major tiles on every call (shape_rule's, the rule before the
    request-major tiles)."""
    rule = tile_rule(layout)

    def launch(n, max_len):
        tpc, shape = rule(n)
        return tpc, shape, -(-n // tpc)
    return forced(layout, launch)


def by_request(layout, batch: int, bounded: bool = True, tpc: int | None = None):
    """``layout`` launching its request-major tiles on every call (the launch rule's tiles, or
    ``tpc`` rows a block, and grid, its row-major choice overridden); ``bounded=False``: the
    entries built without their __launch_bounds__ block count."""
    rule = tile_rule(layout)

    def launch(n, max_len):
        t = tpc or rule(n)[0]
        return t, "req", spec.grid_by_request(batch, max_len, t)
    out = forced(layout, launch)
    if bounded:
        return out
    free = {key: dataclasses.replace(m, name=m.name + "_free", entries=tuple(
        dataclasses.replace(e, min_blocks=0) for e in m.entries)) for key, m in spec.MODULES.items()}
    return rebuilt(out, free)


def tile_variant(layout, batch: int, tpc: int, unroll: int, min_blocks: int, source_dir: str | None = None,
                 tag: str = ""):
    """``layout`` launching request-major tiles of ``tpc`` rows with ``unroll`` loads in flight a
    thread (an entry built for it here, __launch_bounds__ of ``min_blocks`` blocks, from
    ``source_dir``, None: cuda_src/, its name + ``tag``; 16-byte vectors only: the workloads'
    pointers are aligned)."""
    m = spec.MODULES[(16, *layout.types)]
    name = f"{m.name}_req_t{tpc}_u{unroll}{tag}"
    body = f"index_k_read_by_request<16, {unroll}, {layout.types[0]}, {layout.types[1]}, {str(layout.fixed).lower()}>"
    module = dataclasses.replace(m, name=name, source_dir=source_dir, entries=(Entry(name, body, min_blocks),))
    handle = runtime.load(module, layout.device, runtime.current_stream(layout.device))
    go = handle.launcher(name, 0, layout.image)
    return forced(layout, lambda n, max_len: (tpc, "req", spec.grid_by_request(batch, max_len, tpc)),
                  {(16, "req"): go})


def main(workloads):
    flush, acc, p = flush_buffer(), ee.accessor(), ee.pool()
    print(torch.cuda.get_device_name(), torch.__version__, "SGLang:", "yes" if acc else "no")
    for batch, mean in workloads:
        w = ee.Workload(batch, mean)
        fns = ours(w)  # "read": the launch rule's choice
        fns["read"]()  # its layout remembered
        layout = layout_of(w)
        lays = [("rows", row_major(layout)), ("rows_again", row_major(layout)), ("req", by_request(layout, batch))]
        if TILES:  # request-major tiles of other sizes: rows, loads in flight, blocks an SM
            lays += [(f"t{t}u{u}", tile_variant(layout, batch, t, u, b)) for t, u, b in TILE_LIST]
        else:
            lays.append(("req_free", by_request(layout, batch, bounded=False)))
        for name, lay in lays:
            fns[name] = read_on(lay, w)
        got = time_samples(checked(fns, w, acc, p), flush, REPS, order=ORDER)
        print(f"{w.name} (read: {layout.launch(w.tokens, w.longest)}, max {w.longest}): " + medians(got),
              flush=True)
        w = fns = layout = None
        torch.cuda.empty_cache()


def profile(workloads, reps: int = 5):
    """Each of the read (the rule's tiles), its row-major tiles, the gather and SGLang's Triton
    read launched ``reps`` times a workload, untimed, for Nsight Compute (checked equal first):
    are the gaps the event times show inside the kernels?

        ncu --clock-control none --csv --print-units base --metrics gpu__time_duration.sum,\
            sm__cycles_active.avg,launch__registers_per_thread,launch__grid_size,launch__block_size \
            --kernel-name regex:'index_k_read|gather_indexer|_get_k_and_s' \
            python3 benchmarks/experiments/by_request_ab.py profile 16x2048 64x512"""
    acc, p = ee.accessor(), ee.pool()
    for batch, mean in workloads:
        w = ee.Workload(batch, mean)
        fns = ours(w)
        want = torch.cat(fns["read"](), 1)
        layout = layout_of(w)
        rows = row_major(layout)
        fns["rows"] = read_on(rows, w)
        if acc:
            fns["sglang"] = w.sglang_read(acc, p)
        for name in list(fns)[1:]:
            check_same(name, torch.cat(fns[name](), 1), want, w.name)
        torch.cuda.synchronize()
        for name, fn in fns.items():
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
            print(f"{w.name}: {name} x {reps}", file=sys.stderr, flush=True)
        w = fns = layout = rows = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    args = sys.argv[1:]
    go = profile if args[:1] == ["profile"] else main
    args = args[1:] if go is profile else args
    main_args = [tuple(int(x) for x in a.split("x")) for a in args] or WORKLOADS
    go(main_args)
