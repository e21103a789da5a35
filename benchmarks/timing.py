"""How the benchmarks check and time things, in one place (every family module and experiment
uses these): the byte-exact check before any timing, the L2 flush, interleaved CUDA-event
timing, the copy of the same bytes (the ceiling every op is held to), the ratios of a row, and
the host cost of single calls. benchmarks/NOTES.md ("Method") says why each step is there."""
from __future__ import annotations

import random
import statistics
import time

import torch

_SPIN_CYCLES = 100_000  # ~50 µs at the H200's 1.98 GHz
SMALL_TOKENS = 100_000  # calls below this are noisy: more runs for them (timed)


def l2_bytes() -> int:
    return getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 50 << 20)


def flush_buffer() -> torch.Tensor:
    """Zeroing this (twice the L2, plus 64 MiB) before a run evicts whatever the last run left."""
    return torch.empty(2 * l2_bytes() // 4 + (64 << 20) // 4, dtype=torch.int32, device="cuda")


def check_same(who: str, got: torch.Tensor, want: torch.Tensor, where: str) -> None:
    """Raise unless ``got`` holds ``want``'s bytes, naming the first byte that differs."""
    g, w = got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)
    bad = torch.nonzero(g != w).flatten()
    if bad.numel():
        i = int(bad[0])
        raise AssertionError(f"{who} is not byte-exact on {where}: {bad.numel()} bytes differ, first at byte {i}: "
                             f"{int(g[i])} vs {int(w[i])}")


def copy_fn(moved: int, gen: torch.Generator | None = None):
    """A device copy_ that reads and writes moved / 2 bytes each: moved bytes in all."""
    src = torch.randint(0, 256, (moved // 2,), dtype=torch.uint8, device="cuda", generator=gen)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def time_samples(fns: dict, flush: torch.Tensor, reps: int, warmup: int = 3,
                 order: str = "rotate", pre: dict | None = None) -> dict[str, list[float]]:
    """µs of every run of each function, runs interleaved (a, b, c, b, c, a, c, a, b, ...) with
    the L2 flushed before each, so slow drift of clocks or host affects all alike.

    A ~50 µs spin kernel after each flush keeps the GPU busy while the host enqueues the
    timed call (a Python op takes 14-25 µs on the host), so host time cannot reach the
    events. The order rotates because whichever function ran first in every round read up
    to 0.7 µs high on small and one-wave calls (cause not found; benchmarks/NOTES.md).
    ``order="shuffle"``: a random order each round (seeded), so no function follows the same
    one every time (rotated, each mostly follows the one before it in ``fns``). ``pre``: name ->
    a function run after the spin, before that name's first event (untimed)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    names = list(fns)
    shuffled = random.Random(0) if order == "shuffle" else None
    ev = {k: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
          for k in names}
    for i in range(reps):
        # rotated: each goes first in turn; shuffled: a fresh order
        for k in shuffled.sample(names, len(names)) if shuffled else names[i % len(names):] + names[:i % len(names)]:
            flush.zero_()
            torch.cuda._sleep(_SPIN_CYCLES)
            if pre and k in pre:
                pre[k]()
            ev[k][i][0].record()
            fns[k]()
            ev[k][i][1].record()
    torch.cuda.synchronize()
    return {k: [a.elapsed_time(b) * 1000.0 for a, b in ev[k]] for k in names}


def time_gpu(fn, flush: torch.Tensor, reps: int) -> float:
    """Median µs of ``fn`` over ``reps`` runs, L2 flushed before each."""
    return statistics.median(time_samples({"fn": fn}, flush, reps)["fn"])


def timed(row: dict, fns: dict, flush: torch.Tensor, reps: int, small_factor: int = 3) -> dict:
    """``row`` (its "tokens" and "bytes" set) with the interleaved timings of ``fns`` ("op" and
    "copy", maybe "baseline" and others): ``<name>_us`` (median) and ``<name>_spread_us`` ([10th,
    90th] percentile) each, and their ratios. ``reps`` runs each, ``small_factor`` times as many
    below SMALL_TOKENS."""
    n = max(5, reps if row["tokens"] >= SMALL_TOKENS else small_factor * reps)
    for k, xs in time_samples(fns, flush, n).items():
        q = statistics.quantiles(xs, n=10) if len(xs) >= 2 else [xs[0]] * 9
        row[f"{k}_us"] = statistics.median(xs)
        row[f"{k}_spread_us"] = [round(q[0], 2), round(q[-1], 2)]
    return ratios(row)


def ratios(row: dict) -> dict:
    """A timed row's ratios: op and baseline (where timed) to the copy and to each other, GB/s."""
    row["op_over_copy"] = row["op_us"] / row["copy_us"]
    if "baseline_us" in row:
        row["baseline_over_copy"] = row["baseline_us"] / row["copy_us"]
        row["baseline_over_op"] = row["baseline_us"] / row["op_us"]
    row["op_GBps"] = row["bytes"] / row["op_us"] / 1e3
    row["copy_GBps"] = row["bytes"] / row["copy_us"] / 1e3
    return row


def host_costs(calls: dict, per_fn: int = 10000, burst: int = 250, sync=torch.cuda.synchronize) -> dict[str, float]:
    """Median µs of single calls (host cost) of each ``name: (fn, args)``, in bursts of
    ``burst`` calls with an untimed ``sync()`` after each, so the GPU's launch queue never fills
    (a full queue would make the host wait for the GPU and measure kernel time instead). The
    bursts of all functions are interleaved in a rotating order, ``per_fn`` calls each in all:
    the host's speed drifts by tens of percent within minutes, and interleaving makes every
    function (the yardstick included) see the same drift, so their ratios hold."""
    names = list(calls)
    for fn, fargs in calls.values():
        for _ in range(200):
            fn(*fargs)
    sync()
    t = {k: [] for k in names}
    clock = time.perf_counter_ns
    for i in range(-(-per_fn // burst)):
        for k in names[i % len(names):] + names[:i % len(names)]:
            fn, fargs = calls[k]
            ts = t[k]
            for _ in range(burst):
                t0 = clock()
                fn(*fargs)
                ts.append(clock() - t0)
            sync()
    return {k: statistics.median(xs) / 1000.0 for k, xs in t.items()}
