"""Benchmark of the MLA-cache ops: cp_gather_and_upconvert_fp8_kv_cache and concat_and_cache_mla
(fp8_ds_mla), each against a contiguous device copy of the same bytes (the ceiling) and a
vLLM-style baseline kernel (benchmarks/baseline_mla.cu); then the chunked-context gathers of
every MLA model (bench_cache_gather.py: cp_gather_cache, gather_and_maybe_dequant_cache). Wired
into bench.py (the rows land in its JSON record as "mla_gather_workloads", "mla_write_workloads"
and "chunked_gather_workloads", the host cost in "host_cost"); also runs alone:
``python benchmarks/bench_mla.py OUT_DIR`` (writes bench_mla.json and bench_mla.md).

DeepSeek shapes: 64-token blocks of 656-byte records (512 fp8 codes, 4 fp32 tile scales, 64
bf16 k_pe values), bf16 rows of 576 values. The gather reads 656 B and writes 1152 B per token;
the write reads 1152 B (kv_c 512 + k_pe 64 bf16 values) and writes 656 B. The copy ceiling
copies half the total in the same run. Caches are at least 4x the L2, blocks shuffled.

Every implementation is checked bit-exact before it is timed: the op against the torch path
(run on the GPU), the baselines against the op (the write baseline uses vLLM's older tile-scale
rule, so against ``ds_scale_rule="plain"``). Timing as bench.py's: CUDA events, the L2 flushed
and the GPU kept busy before every run, the implementations' runs interleaved in a rotating
order; the median and the 10th-90th percentile spread are recorded.

It reaches the package through the public ops, their ``plan_*`` / ``prepared`` hooks and
``jit.runtime.load`` (for the baseline modules, whose source lives beside this file)."""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from nvrtc_gather.jit import compiler, driver, runtime
from nvrtc_gather.jit.spec import Entry, KernelModule, ParamStruct
from nvrtc_gather.ops import mla_gather, mla_write
from nvrtc_gather.ops.mla_gather_torch import gather_torch
from nvrtc_gather.ops.mla_write_torch import write_torch
from timing import flush_buffer, host_costs, l2_bytes, summarize, time_samples

HERE = Path(__file__).resolve().parent
BLOCK_SIZE = 64
RECORD = 656            # bytes per cached token
ROW = 576               # bf16 values per gathered row
ROW_BYTES = 2 * ROW     # 1152
NOPE, ROPE = 512, 64
WRITE_READ = 2 * (NOPE + ROPE)  # 1152 bytes of bf16 input per token

# Each baseline has a parameter struct of its own (benchmarks/baseline_mla.cu declares the same).
BASELINE_GATHER_PARAMS = ParamStruct("BaselineMlaGatherParams", (
    ("src_cache", "ptr"), ("dst", "ptr"), ("block_table", "ptr"), ("workspace_starts", "ptr"), ("seq_starts", "ptr"),
    ("block_stride", "i64"), ("entry_stride", "i64"), ("dst_row_stride", "i64"), ("bt_row_stride", "i64"),
    ("num_rows", "i32"), ("batch", "i32"), ("block_size", "i32"), ("unused", "i32"),
    ("error", "ptr"),
))
BASELINE_WRITE_PARAMS = ParamStruct("BaselineMlaWriteParams", (
    ("kv_c", "ptr"), ("k_pe", "ptr"), ("slot_mapping", "ptr"), ("kv_cache", "ptr"),
    ("kv_c_row_stride", "i64"), ("k_pe_row_stride", "i64"), ("block_stride", "i64"), ("entry_stride", "i64"),
    ("num_tokens", "i32"), ("block_size", "i32"),
    ("error", "ptr"),
))
BASELINE_MLA_GATHER = KernelModule(name="baseline_mla_gather", source="baseline_mla.cu",
                                   entries=(Entry("baseline_mla_gather"),), params=BASELINE_GATHER_PARAMS,
                                   label="baseline", threads=512, source_dir=str(HERE))
BASELINE_MLA_WRITE = KernelModule(name="baseline_mla_write", source="baseline_mla.cu",
                                  entries=(Entry("baseline_mla_write"),), params=BASELINE_WRITE_PARAMS,
                                  label="baseline", threads=96, source_dir=str(HERE))

GATHER_WORKLOADS = [  # (requests, mean context tokens per request)
    (1, 65536), (1, 131072), (8, 16384), (64, 2048), (256, 1000), (1024, 256), (4096, 64), (1, 1000), (8, 100),
]
WRITE_WORKLOADS = [  # (tokens, slot pattern)
    (1024, "paged"), (1024, "scattered"), (16384, "paged"), (131072, "paged"), (1 << 20, "paged"),
    (1 << 20, "scattered"),
]
DEFAULT_REPS = 40
SMALL_TOKENS = 100_000   # calls below this are noisy: 3x the runs
def _reps_for(tokens: int, reps: int) -> int:
    return max(5, reps if tokens >= SMALL_TOKENS else 3 * reps)


def _copy_fns(moved: int, gen: torch.Generator):
    """A device copy_ that reads and writes moved / 2 bytes each: moved bytes in all."""
    src = torch.randint(0, 256, (moved // 2,), dtype=torch.uint8, device="cuda", generator=gen)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def _first_diff(got: torch.Tensor, want: torch.Tensor) -> str:
    g, w = got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)
    bad = torch.nonzero(g != w).flatten()
    if bad.numel() == 0:
        return "equal"
    i = int(bad[0])
    return f"{bad.numel()} bytes differ, first at byte {i}: {int(g[i])} vs {int(w[i])}"


# -- the gather ---------------------------------------------------------------------------------

def ragged_lengths(rng: random.Random, batch: int, mean: int) -> list[int]:
    """bench.py's lengths: 0.5x..1.5x the mean, about 5% empty when batch > 1; one request exact."""
    if batch == 1:
        return [mean]
    return [0 if rng.random() < 0.05 else max(1, round(mean * rng.uniform(0.5, 1.5))) for _ in range(batch)]


class GatherWorkload:
    """One gather workload on the GPU: random record bytes in a cache at least 4x the L2,
    shuffled blocks, workspace_starts = cu_seq_lens (batch + 1 entries), no seq_starts."""

    def __init__(self, batch: int, mean: int, l2: int, seed: int):
        rng = random.Random(seed)
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.name, self.batch = f"{batch}x{mean}", batch
        self.lens = ragged_lengths(rng, batch, mean)
        self.tokens = sum(self.lens)
        blocks_per = [math.ceil(n / BLOCK_SIZE) for n in self.lens]
        need = sum(blocks_per)
        num_blocks = max(need, 4 * l2 // (BLOCK_SIZE * RECORD))
        self.cache = torch.randint(0, 256, (num_blocks, BLOCK_SIZE, RECORD), dtype=torch.uint8, device="cuda",
                                   generator=gen)
        ids = torch.randperm(num_blocks, device="cuda", generator=gen)[:need].to(torch.int32).cpu()
        bt = torch.zeros(batch, max(blocks_per + [1]), dtype=torch.int32)
        k = 0
        for r, nb in enumerate(blocks_per):
            bt[r, :nb] = ids[k:k + nb]
            k += nb
        self.block_table = bt.cuda()
        cu = [0]
        for n in self.lens:
            cu.append(cu[-1] + n)
        self.ws = torch.tensor(cu, dtype=torch.int32, device="cuda")
        self.moved = self.tokens * (RECORD + ROW_BYTES)

    def dst(self) -> torch.Tensor:
        d = torch.empty(self.tokens, ROW, dtype=torch.bfloat16, device="cuda")
        d.view(torch.uint8).fill_(0xA5)
        return d

    def args(self, dst):
        return self.cache, dst, self.block_table, self.ws, self.batch


def gather_baseline(w: GatherWorkload, dst: torch.Tensor):
    """A no-argument launch of the vLLM-style gather (baseline_mla.cu) on ``w`` into ``dst``."""
    dev = torch.cuda.current_device()
    p = mla_gather.plan_gather(*w.args(dst))
    image = BASELINE_GATHER_PARAMS.image(
        src_cache=p.src_ptr, dst=p.dst_ptr, block_table=p.bt_ptr, workspace_starts=p.ws_ptr, seq_starts=p.seq_ptr,
        block_stride=p.block_stride, entry_stride=p.entry_stride, dst_row_stride=p.dst_row_stride,
        bt_row_stride=p.bt_row_stride, num_rows=p.num_rows, batch=p.batch, block_size=p.block_size, unused=0)
    grid = -(-p.num_rows // p.block_size) + 2 * p.batch
    go = runtime.load(BASELINE_MLA_GATHER, dev, runtime.current_stream(dev)).launcher("baseline_mla_gather", grid, image)

    def run(_keep=(w, dst)):  # launched on torch's current stream, bound once like the op's layout
        go(())
    return run


def bench_mla_gather(reps: int = DEFAULT_REPS, flush: torch.Tensor | None = None) -> list[dict]:
    """One row per GATHER_WORKLOADS entry: op, baseline and copy interleaved."""
    flush = flush_buffer() if flush is None else flush
    l2 = l2_bytes()
    rows = []
    for batch, mean in GATHER_WORKLOADS:
        w = GatherWorkload(batch, mean, l2, seed=batch * 7 + mean)
        want = w.dst()
        gather_torch(mla_gather.plan_gather(*w.args(want)), *w.args(want)[:4], None)
        dst_op, dst_base = w.dst(), w.dst()
        op = lambda: mla_gather.cp_gather_and_upconvert_fp8_kv_cache(*w.args(dst_op))  # noqa: E731
        base = gather_baseline(w, dst_base)
        op()
        base()
        torch.cuda.synchronize()
        if not torch.equal(dst_op.view(torch.int16), want.view(torch.int16)):
            raise AssertionError(f"mla gather op is not bit-exact against the torch path on {w.name}: "
                                 + _first_diff(dst_op, want))
        if not torch.equal(dst_base.view(torch.int16), dst_op.view(torch.int16)):
            raise AssertionError(f"mla gather baseline differs from the op on {w.name}: "
                                 + _first_diff(dst_base, dst_op))
        want = dst_base = None
        gen = torch.Generator(device="cuda").manual_seed(batch)
        plan = mla_gather.plan_gather(*w.args(dst_op))
        fns = {"op": op, "baseline": gather_baseline(w, dst_op), "copy": _copy_fns(w.moved, gen)}
        row = {"workload": w.name, "requests": batch, "tokens": w.tokens, "bytes": w.moved,
               "rows_per_cta": plan.rows_per_cta, "vec": plan.vec}
        rows.append(timed(row, fns, flush, reps))
        print(fmt_row(row), flush=True)
        w = fns = op = base = dst_op = None  # free the workload before the next
        torch.cuda.empty_cache()
    return rows


# -- the write ----------------------------------------------------------------------------------

def _slots(tokens: int, num_blocks: int, pattern: str, gen: torch.Generator) -> torch.Tensor:
    """bench_quant.py's patterns: "scattered" = random slots anywhere in the cache (decode
    tokens of as many requests); "paged" = shuffled blocks filled in order (one prefill)."""
    if pattern == "scattered":
        return torch.randperm(num_blocks * BLOCK_SIZE, device="cuda", generator=gen)[:tokens]
    blocks = torch.randperm(num_blocks, device="cuda", generator=gen)
    i = torch.arange(tokens, device="cuda")
    return blocks[i // BLOCK_SIZE] * BLOCK_SIZE + i % BLOCK_SIZE


class WriteWorkload:
    def __init__(self, tokens: int, pattern: str, l2: int, seed: int):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.name, self.tokens, self.pattern = f"{tokens} {pattern}", tokens, pattern
        self.requests = 1 if pattern == "paged" else tokens
        need = -(-tokens // BLOCK_SIZE)
        num_blocks = max(4 * need, 4 * l2 // (BLOCK_SIZE * RECORD))
        self.cache = torch.randint(0, 256, (num_blocks, BLOCK_SIZE, RECORD), dtype=torch.uint8, device="cuda",
                                   generator=gen)
        self.slots = _slots(tokens, num_blocks, pattern, gen)
        self.kv_c = torch.randn(tokens, NOPE, device="cuda", generator=gen).to(torch.bfloat16)
        self.k_pe = torch.randn(tokens, ROPE, device="cuda", generator=gen).to(torch.bfloat16)
        self.scale = torch.ones(1, dtype=torch.float32, device="cuda")
        self.moved = tokens * (WRITE_READ + RECORD)

    def args(self, cache, rule="pow2"):
        return self.kv_c, self.k_pe, cache, self.slots, "fp8_ds_mla", self.scale, False, rule


def write_baseline(w: WriteWorkload, cache: torch.Tensor):
    """A no-argument launch of the vLLM-style write (baseline_mla.cu) on ``w`` into ``cache``."""
    dev = torch.cuda.current_device()
    p = mla_write.plan_write(*w.args(cache))
    image = BASELINE_WRITE_PARAMS.image(
        kv_c=p.kv_c_ptr, k_pe=p.k_pe_ptr, slot_mapping=p.slot_ptr, kv_cache=p.kv_ptr,
        kv_c_row_stride=p.kv_c_row_stride, k_pe_row_stride=p.k_pe_row_stride, block_stride=p.block_stride,
        entry_stride=p.entry_stride, num_tokens=p.num_tokens, block_size=p.block_size)
    go = runtime.load(BASELINE_MLA_WRITE, dev, runtime.current_stream(dev)).launcher("baseline_mla_write", p.num_tokens,
                                                                                     image)

    def run(_keep=(w, cache)):  # launched on torch's current stream, bound once like the op's layout
        go(())
    return run


def bench_mla_write(reps: int = DEFAULT_REPS, flush: torch.Tensor | None = None) -> list[dict]:
    """One row per WRITE_WORKLOADS entry: the op (ds_scale_rule "pow2", the default, and
    "plain", the baseline's rule), the baseline and the copy, interleaved."""
    flush = flush_buffer() if flush is None else flush
    l2 = l2_bytes()
    rows = []
    for tokens, pattern in WRITE_WORKLOADS:
        w = WriteWorkload(tokens, pattern, l2, seed=tokens + (pattern == "paged"))
        want = w.cache.clone()
        write_torch(mla_write.plan_write(*w.args(want)), w.kv_c, w.k_pe, want, w.slots, w.scale)
        got = w.cache.clone()
        mla_write.concat_and_cache_mla(*w.args(got))
        torch.cuda.synchronize()
        if not torch.equal(got, want):
            raise AssertionError(f"mla write op is not bit-exact against the torch path on {w.name}: "
                                 + _first_diff(got, want))
        got.copy_(w.cache)
        mla_write.concat_and_cache_mla(*w.args(got, "plain"))
        base = w.cache.clone()
        write_baseline(w, base)()
        torch.cuda.synchronize()
        if not torch.equal(base, got):
            raise AssertionError(f"mla write baseline differs from the op (ds_scale_rule='plain') on {w.name}: "
                                 + _first_diff(base, got))
        want = base = None
        cache = got  # every implementation writes this one cache (same bytes, same placement)
        gen = torch.Generator(device="cuda").manual_seed(tokens)
        fns = {"op": lambda: mla_write.concat_and_cache_mla(*w.args(cache)),
               "op_plain": lambda: mla_write.concat_and_cache_mla(*w.args(cache, "plain")),
               "baseline": write_baseline(w, cache), "copy": _copy_fns(w.moved, gen)}
        row = {"workload": w.name, "requests": w.requests, "tokens": tokens, "bytes": w.moved,
               "vec": mla_write.plan_write(*w.args(cache)).vec}
        rows.append(timed(row, fns, flush, reps))
        print(fmt_row(row) + f"  (plain rule {row['op_plain_us']:.1f})", flush=True)
        w = fns = cache = got = None
        torch.cuda.empty_cache()
    return rows


def timed(row: dict, fns: dict, flush: torch.Tensor, reps: int) -> dict:
    """``row`` (its "tokens" set) with the interleaved timings of ``fns`` (op, baseline, copy:
    medians and spreads, more runs for small calls) and their ratios."""
    summarize(row, time_samples(fns, flush, _reps_for(row["tokens"], reps)))
    _ratios(row)
    return row


def _ratios(row: dict) -> None:
    row["op_over_copy"] = row["op_us"] / row["copy_us"]
    row["baseline_over_copy"] = row["baseline_us"] / row["copy_us"]
    row["baseline_over_op"] = row["baseline_us"] / row["op_us"]
    row["op_GBps"] = row["bytes"] / row["op_us"] / 1e3
    row["copy_GBps"] = row["bytes"] / row["copy_us"] / 1e3


# -- host cost per call -------------------------------------------------------------------------

HOST_KEYS = ("mla_write_us", "mla_write_custom_op_us", "mla_gather_us", "mla_gather_custom_op_us")


def mla_host_calls() -> dict:
    """The calls whose host cost is measured (``name_us: (fn, args)``, for timing.host_costs):
    both ops through the plain function and torch.ops.nvrtc_gather.*, on small tensors (1000
    tokens; one request of 1000), and each op's full checks (plan_*: what a call with a new
    layout pays first). bench.py measures them beside its torch copy_ yardstick."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    n = 1000
    cache = torch.randint(0, 256, (64, BLOCK_SIZE, RECORD), dtype=torch.uint8, device="cuda", generator=gen)
    kv_c = torch.randn(n, NOPE, device="cuda", generator=gen).to(torch.bfloat16)
    k_pe = torch.randn(n, ROPE, device="cuda", generator=gen).to(torch.bfloat16)
    slots = torch.arange(n, device="cuda", dtype=torch.int64)
    scale = torch.ones(1, device="cuda")
    wargs = (kv_c, k_pe, cache, slots, "fp8_ds_mla", scale)
    dst = torch.empty(n, ROW, dtype=torch.bfloat16, device="cuda")
    bt = torch.arange(16, dtype=torch.int32, device="cuda").view(1, 16)
    ws = torch.zeros(1, dtype=torch.int32, device="cuda")
    gargs = (cache, dst, bt, ws, 1)
    ops = torch.ops.nvrtc_gather
    return {
        "mla_write_us": (mla_write.concat_and_cache_mla, wargs),
        "mla_write_custom_op_us": (ops.concat_and_cache_mla, wargs),
        "mla_gather_us": (mla_gather.cp_gather_and_upconvert_fp8_kv_cache, gargs),
        "mla_gather_custom_op_us": (ops.cp_gather_and_upconvert_fp8_kv_cache, gargs),
        "mla_write_full_checks_us": (mla_write.plan_write, wargs),
        "mla_gather_full_checks_us": (mla_gather.plan_gather, gargs),
    }


def mla_host_cost() -> dict:
    """mla_host_calls' host costs beside torch's copy_ of 4 KiB, interleaved (timing.host_costs)."""
    a, b = torch.empty(1024, device="cuda"), torch.empty(1024, device="cuda")
    out = host_costs({"torch_copy_us": (a.copy_, (b,)), **mla_host_calls()})
    for k in HOST_KEYS:
        out[k.replace("_us", "_over_copy")] = round(out[k] / out["torch_copy_us"], 3)
    return out


# -- first calls in a fresh process -------------------------------------------------------------

_FIRST_CALL = r"""
import time, torch
import nvrtc_gather as ng
from nvrtc_gather.jit import build
cache = torch.randint(0, 256, (64, 64, 656), dtype=torch.uint8, device="cuda")
kv_c = torch.randn(1000, 512, device="cuda").to(torch.bfloat16); k_pe = torch.randn(1000, 64, device="cuda").to(torch.bfloat16)
slots = torch.arange(1000, device="cuda"); scale = torch.ones(1, device="cuda")
dst = torch.empty(1000, 576, dtype=torch.bfloat16, device="cuda")
bt = torch.arange(16, dtype=torch.int32, device="cuda").view(1, 16); ws = torch.zeros(1, dtype=torch.int32, device="cuda")
torch.cuda.synchronize()
t0 = time.perf_counter()
ng.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8_ds_mla", scale); torch.cuda.synchronize()
t1 = time.perf_counter()
ng.cp_gather_and_upconvert_fp8_kv_cache(cache, dst, bt, ws, 1); torch.cuda.synchronize()
t2 = time.perf_counter()
print((t1 - t0) * 1000, (t2 - t1) * 1000, build.stats["compiles"])
"""


def first_calls() -> dict:
    """First write and first gather in a fresh process: on an empty cache (compile + load) and
    on the cache that run filled."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, NVRTC_GATHER_CACHE_DIR=d)
        out = []
        for _ in range(3):
            r = subprocess.run([sys.executable, "-c", _FIRST_CALL], env=env, capture_output=True, text=True,
                               check=True, timeout=300)
            w_ms, g_ms, compiles = r.stdout.split()[-3:]
            out.append((float(w_ms), float(g_ms), int(compiles)))
    return {"cold_write_ms": out[0][0], "cold_gather_ms": out[0][1], "cold_compiles": out[0][2],
            "warm_write_ms": min(o[0] for o in out[1:]), "warm_gather_ms": min(o[1] for o in out[1:]),
            "warm_compiles": out[1][2]}


# -- output -------------------------------------------------------------------------------------

HEADER = (f"{'MLA workload':>16} {'tokens':>9} {'copy us':>9} {'op us':>9} {'op/cp':>7} {'base us':>9} "
          f"{'base/cp':>7} {'op p10-p90':>15}")


def fmt_row(r: dict) -> str:
    lo, hi = r["op_spread_us"]
    return (f"{r['workload']:>16} {r['tokens']:>9} {r['copy_us']:9.1f} {r['op_us']:9.1f} {r['op_over_copy']:6.2f}x "
            f"{r['baseline_us']:9.1f} {r['baseline_over_copy']:6.2f}x {lo:7.1f}-{hi:<7.1f}")


def _table(title: str, rows: list[dict], extra: str = "") -> list[str]:
    out = ["", f"| {title} | requests | tokens | MB moved | copy | op | op / copy | baseline | baseline / copy "
               f"| op p10-p90 | baseline p10-p90 |{extra}",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if extra else "")]
    for r in rows:
        (olo, ohi), (blo, bhi) = r["op_spread_us"], r["baseline_spread_us"]
        line = (f"| {r['workload']} | {r['requests']} | {r['tokens']} | {r['bytes'] / 1e6:.1f} | {r['copy_us']:.1f} | "
                f"{r['op_us']:.1f} | {r['op_over_copy']:.2f} | {r['baseline_us']:.1f} | {r['baseline_over_copy']:.2f} | "
                f"{olo:.1f}-{ohi:.1f} | {blo:.1f}-{bhi:.1f} |")
        if extra:
            line += f" {r['op_plain_us']:.1f} |"
        out.append(line)
    return out


def markdown_tables(result: dict) -> list[str]:
    """The MLA tables of a result (bench.py's or this module's), as markdown lines."""
    out = []
    if result.get("mla_gather_workloads"):
        out += _table("MLA gather (requests x context)", result["mla_gather_workloads"])
    if result.get("mla_write_workloads"):
        out += _table("MLA write fp8_ds_mla", result["mla_write_workloads"], " op, plain scale rule |")
    if result.get("chunked_gather_workloads"):
        from bench_cache_gather import markdown_table
        out += markdown_table(result["chunked_gather_workloads"])
    return out


def environment() -> dict:
    return {"gpu": torch.cuda.get_device_name(0), "driver_cuda": driver.driver_version(), "torch": torch.__version__,
            "nvrtc": "%d.%d" % compiler.nvrtc_version(), "python": platform.python_version(),
            "date": datetime.date.today().isoformat()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/bench_mla.py", description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="folder for bench_mla.json and bench_mla.md")
    ap.add_argument("--reps", type=int, default=DEFAULT_REPS,
                    help=f"timed runs per implementation (x3 below {SMALL_TOKENS} tokens)")
    ap.add_argument("--skip-first-calls", action="store_true")
    ap.add_argument("--skip-host-cost", action="store_true")
    ap.add_argument("--skip-chunked", action="store_true",
                    help="skip the chunked-context gathers' table (bench_cache_gather.py)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/bench_mla.py: no CUDA GPU visible; the benchmark needs one.", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    env = environment()
    print(env)
    flush = flush_buffer()
    print(HEADER)
    gathers = bench_mla_gather(args.reps, flush)
    print(HEADER.replace("MLA workload", "MLA write"))
    writes = bench_mla_write(args.reps, flush)
    chunked = []
    if not args.skip_chunked:
        import bench_cache_gather
        print(bench_cache_gather.HEADER)
        chunked = bench_cache_gather.bench_chunked(args.reps, flush)
    host = {} if args.skip_host_cost else mla_host_cost()
    if host:
        print("host cost per call, µs: " + ", ".join(f"{k[:-3]} {v:.2f}" for k, v in host.items() if k.endswith("_us")))
    first = {} if args.skip_first_calls else first_calls()
    if first:
        print(f"first calls, fresh process: {first}")
    result = {"environment": env, "mla_gather_workloads": gathers, "mla_write_workloads": writes,
              "chunked_gather_workloads": chunked, "mla_host_cost": host, "mla_first_call": first, "reps": args.reps,
              "seconds": round(time.perf_counter() - t0, 1)}
    (args.out / "bench_mla.json").write_text(json.dumps(result, indent=2))
    md = markdown_tables(result)
    if host:
        md += ["", "| host cost per call (median of 10,000) | µs | / torch copy_ |", "| --- | --- | --- |"]
        md += [f"| {k[:-3].replace('_', ' ')} | {v:.2f} | {host.get(k[:-3] + '_over_copy', '')} |"
               for k, v in host.items() if k.endswith("_us")]
    (args.out / "bench_mla.md").write_text("\n".join(md).lstrip("\n") + "\n")
    print("\n".join(md))
    print(f"wrote {args.out / 'bench_mla.json'} and bench_mla.md ({result['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
