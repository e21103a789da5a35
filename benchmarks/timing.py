"""How the benchmarks time things, in one place (bench.py, bench_mla.py, sweep_mla.py and the
experiment scripts use these): the L2 flush, interleaved CUDA-event timing, and the host cost of
single calls. benchmarks/NOTES.md ("Method") says why each step is there."""
from __future__ import annotations

import statistics
import time

import torch

_SPIN_CYCLES = 100_000  # ~50 µs at the H200's 1.98 GHz


def l2_bytes() -> int:
    return getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 50 << 20)


def flush_buffer() -> torch.Tensor:
    """Zeroing this (twice the L2, plus 64 MiB) before a run evicts whatever the last run left."""
    return torch.empty(2 * l2_bytes() // 4 + (64 << 20) // 4, dtype=torch.int32, device="cuda")


def time_samples(fns: dict, flush: torch.Tensor, reps: int, warmup: int = 3) -> dict[str, list[float]]:
    """µs of every run of each function, runs interleaved (a, b, c, b, c, a, c, a, b, ...) with
    the L2 flushed before each, so slow drift of clocks or host affects all alike.

    A ~50 µs spin kernel after each flush keeps the GPU busy while the host enqueues the
    timed call (a Python op takes 14-25 µs on the host), so host time cannot reach the
    events. The order rotates because whichever function ran first in every round read up
    to 0.7 µs high on small and one-wave calls (cause not found; benchmarks/NOTES.md)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    names = list(fns)
    ev = {k: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
          for k in names}
    for i in range(reps):
        for k in names[i % len(names):] + names[:i % len(names)]:  # each goes first in turn
            flush.zero_()
            torch.cuda._sleep(_SPIN_CYCLES)
            ev[k][i][0].record()
            fns[k]()
            ev[k][i][1].record()
    torch.cuda.synchronize()
    return {k: [a.elapsed_time(b) * 1000.0 for a, b in ev[k]] for k in names}


def time_interleaved(fns: dict, flush: torch.Tensor, reps: int, warmup: int = 3) -> dict:
    """Median µs of each function (time_samples)."""
    return {k: statistics.median(xs) for k, xs in time_samples(fns, flush, reps, warmup).items()}


def time_gpu(fn, flush: torch.Tensor, reps: int, warmup: int = 3) -> float:
    """Median µs of ``fn`` over ``reps`` runs, L2 flushed before each."""
    return time_interleaved({"fn": fn}, flush, reps, warmup)["fn"]


def summarize(row: dict, samples: dict[str, list[float]]) -> None:
    """``<name>_us`` (median) and ``<name>_spread_us`` ([10th, 90th] percentile) per function."""
    for k, xs in samples.items():
        q = statistics.quantiles(xs, n=10) if len(xs) >= 2 else [xs[0]] * 9
        row[f"{k}_us"] = statistics.median(xs)
        row[f"{k}_spread_us"] = [round(q[0], 2), round(q[-1], 2)]


def host_costs(calls: dict, per_fn: int = 10000, burst: int = 250, sync=torch.cuda.synchronize) -> dict[str, float]:
    """Median µs of single calls (host cost) of each ``name: (fn, args)``, in bursts of
    ``burst`` calls with an untimed ``sync()`` after each, so the GPU's launch queue never fills
    (a full queue would make the host wait for the GPU and measure kernel time instead;
    host_overhead_cpu.py, with no GPU, passes a no-op). The bursts of all functions are
    interleaved in a rotating order, ``per_fn`` calls each in all: the host's speed drifts by
    tens of percent within minutes, and interleaving makes every function (the yardstick
    included) see the same drift, so their ratios hold."""
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
