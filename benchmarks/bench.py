"""The benchmark: ``python benchmarks/bench.py OUT_DIR`` on a GPU machine (with nvrtc_gather
importable: installed, or PYTHONPATH=. from a checkout); ``--dry-run`` without a GPU.

Each family module (FAMILIES) declares its workloads and checks; this driver runs the chosen
families in turn (each row checked bit-exact, then timed against a copy of the same bytes:
timing.py), measures the host cost per call of every family's calls in one interleaved run
beside torch's ``copy_``, and writes the record (record.py: bench.json, bench.md, bench.png).

A family module provides NAME (its name on the command line), REPS (timed runs per
implementation by default), ``bench(opts, reps, flush) -> {record key: rows}``, ``dry_run() ->
{record key: each row's identity}`` (every workload built and planned on the CPU, baselines
compiled) and ``markdown(record) -> lines``; optionally ``add_options(parser)``, and
``host_calls() -> {name_us: (fn, args)}`` with HOST_RATIOS (the names given as ratios to
``copy_``). Adding a family is that module and one line in FAMILIES."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import chunked
import dsv4
import engine_entries
import indexer
import mla
import record

FAMILIES = (
    indexer,   # cp_gather_indexer_k_quant_cache, indexer_k_quant_and_cache
    mla,       # cp_gather_and_upconvert_fp8_kv_cache, concat_and_cache_mla
    chunked,   # cp_gather_cache, gather_and_maybe_dequant_cache
    engine_entries,  # SGLang's index-K read and write as SGLang calls them
    dsv4,      # DeepSeek-V4's record gathers, SGLang's and vLLM's forms
)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="benchmarks/bench.py", description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, nargs="?", help="folder for bench.json, bench.md and bench.png")
    names = ",".join(f.NAME for f in FAMILIES)
    ap.add_argument("--families", default=names, help=f"comma-separated families to run (default: {names})")
    ap.add_argument("--skip", default="", help="comma-separated families to leave out")
    ap.add_argument("--skip-mla", action="store_true", help="--skip mla,chunked")
    ap.add_argument("--skip-chunked", action="store_true", help="--skip chunked")
    ap.add_argument("--reps", type=int, default=None,
                    help="timed runs per implementation (default: each family's REPS; more below 100K tokens)")
    ap.add_argument("--skip-first-calls", action="store_true")
    ap.add_argument("--host-cost-only", action="store_true", help="only the host cost per call")
    ap.add_argument("--tag", default="", help="label stored in the record (e.g. the kernel version)")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: build and plan every row's workload on the CPU, compile the baselines")
    for fam in FAMILIES:
        if hasattr(fam, "add_options"):
            fam.add_options(ap.add_argument_group(fam.NAME))
    return ap


def chosen(args) -> list:
    skip = set(filter(None, args.skip.split(","))) | ({"mla", "chunked"} if args.skip_mla else set()) | (
        {"chunked"} if args.skip_chunked else set())
    names = [n for n in args.families.split(",") if n and n not in skip]
    unknown = set(names) - {f.NAME for f in FAMILIES}
    if unknown:
        raise SystemExit(f"benchmarks/bench.py: no family {sorted(unknown)}; families: {[f.NAME for f in FAMILIES]}")
    return [f for f in FAMILIES if f.NAME in names]


def host_cost(families) -> dict:
    """Median µs per call of every family's host calls beside torch's copy_ of 4 KiB, their
    bursts interleaved in one run (timing.host_costs), and the named ratios to copy_."""
    import torch
    from timing import host_costs
    a, b = torch.empty(1024, device="cuda"), torch.empty(1024, device="cuda")
    calls = {"torch_copy_us": (a.copy_, (b,))}
    for fam in families:
        calls.update(fam.host_calls() if hasattr(fam, "host_calls") else {})
    out = host_costs(calls, 10000)
    out["calls"] = 10000
    for fam in families:
        for key in (k for k in getattr(fam, "HOST_RATIOS", ()) if k in out):  # SGLang's calls: where it imports
            out[key.replace("_us", "_over_copy")] = round(out[key] / out["torch_copy_us"], 3)
    return out


def dry_run(families) -> dict:
    """Each family's dry run: its rows' identities by record key."""
    out = {}
    for fam in families:
        t0 = time.perf_counter()
        got = fam.dry_run()
        print(f"{fam.NAME}: " + ", ".join(f"{len(rows)} {key}" for key, rows in got.items())
              + f" planned, baselines compiled for sm_90 ({time.perf_counter() - t0:.1f} s)", flush=True)
        out.update(got)
    return out


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    families = chosen(args)
    if args.dry_run:
        rows = dry_run(families)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "dry_run.json").write_text(json.dumps(rows, indent=1))
        return 0
    import torch
    from timing import flush_buffer
    if args.out is None:
        parser().error("OUT_DIR is needed (unless --dry-run)")
    if not torch.cuda.is_available():
        print("benchmarks/bench.py: no CUDA GPU visible; the benchmark needs one (--dry-run does not).",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    result = {"environment": record.environment()}
    print(result["environment"], flush=True)
    flush = None if args.host_cost_only else flush_buffer()
    for fam in [] if args.host_cost_only else families:
        result.update(fam.bench(args, args.reps or fam.REPS, flush))
    result["host_cost"] = host_cost(families)
    print("\n".join(record.host_lines(result["host_cost"])), flush=True)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    if args.tag:
        result["tag"] = args.tag
    names = record.write(args.out, result, families)
    print(f"wrote {', '.join(names)} in {args.out} ({result['seconds']} s)"
          + ("" if "bench.png" in names or "workloads" not in result else
             "; the chart (bench.png) needs matplotlib: pip install 'nvrtc-gather[bench]'"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
