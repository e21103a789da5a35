"""Benchmark of the chunked-context gathers (issue 27): cp_gather_cache (fp8 entries, a byte copy)
and gather_and_maybe_dequant_cache ("auto" bf16, and "fp8" -> bf16 with a scale), each with and
without seq_starts, over issue 27's workloads (bench_mla.GATHER_WORKLOADS), against a contiguous
device copy of the same bytes (the ceiling) and a vLLM-style baseline kernel (the chunked-gather
kernels at the end of benchmarks/baseline_mla.cu). Timed by bench_mla.py and bench.py (the rows
land in their JSON record as "chunked_gather_workloads"; ``--skip-chunked`` leaves them out).
Without a GPU, ``python benchmarks/bench_cache_gather.py --dry-run`` builds every workload's index
tensors on the CPU, runs the op's full checks on them, checks the byte counts against a count of
its own and compiles the baseline for sm_90 with NVRTC (tests/benchmarks/test_bench_cache_gather.py
runs it, and the baseline on the host emulator).

Shapes: 64-token blocks of 576-value entries (DeepSeek's 512 latent + 64 RoPE), blocks shuffled,
caches at least 4x the L2, ragged requests (bench.py's lengths). With seq_starts, request r's
context starts at a random position below its mean length (pages partial at both ends), as in a
later prefill chunk. Bytes moved per token: cp_gather_cache 576 read + 576 written; the "auto"
gather 1152 + 1152; the fp8 one 576 + 1152. The copy moves as many bytes in all (half read).

Every implementation is checked byte for byte before it is timed: the op against its torch path
(run on the GPU), the baseline against the same (destinations poisoned first). Timing as
bench_mla.py's (timing.py: CUDA events, the L2 flushed and the GPU kept busy before every run,
runs interleaved in a rotating order; medians and the 10th-90th percentile spread). Each row
prints issue 27's targets: op <= 1.1x the copy from 64K tokens, <= 1.3x below, and faster than
the baseline."""
from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

import torch

from nvrtc_gather.jit import compiler, runtime
from nvrtc_gather.jit.spec import Entry, KernelModule, ParamStruct
from nvrtc_gather.ops import cache_gather
from nvrtc_gather.ops.cache_gather_torch import gather_torch

HERE = Path(__file__).resolve().parent
BLOCK_SIZE = 64
ENTRY = 576               # values per entry
THREADS = 256             # the baseline's (vLLM's below 2^20 rows)
SCALE = 0.37
# (name, op, kv_cache_dtype, cache dtype, dst dtype, baseline entry point)
VARIANTS = (
    ("cp_gather fp8", "cp_gather_cache", None, torch.uint8, torch.uint8, "baseline_cp_gather"),
    ("dequant auto bf16", "gather_and_maybe_dequant_cache", "auto", torch.bfloat16, torch.bfloat16,
     "baseline_dequant_auto_bf16"),
    ("dequant fp8->bf16", "gather_and_maybe_dequant_cache", "fp8", torch.uint8, torch.bfloat16,
     "baseline_dequant_fp8_bf16"),
)
TARGET_LARGE, TARGET_SMALL, LARGE_TOKENS = 1.1, 1.3, 65536  # issue 27's ratios to the copy

BASELINE_PARAMS = ParamStruct("BaselineCacheGatherParams", (
    ("src_cache", "ptr"), ("dst", "ptr"), ("block_table", "ptr"), ("cu_seq_lens", "ptr"), ("seq_starts", "ptr"),
    ("scale", "ptr"),
    ("block_stride", "i64"), ("entry_stride", "i64"), ("dst_row_stride", "i64"), ("bt_row_stride", "i64"),
    ("num_rows", "i32"), ("batch", "i32"), ("block_size", "i32"), ("max_blocks", "i32"), ("row_bytes", "i32"),
    ("unused", "i32"),
    ("error", "ptr"),
))
BASELINE = KernelModule(name="baseline_cache_gather", source="baseline_mla.cu",
                        entries=tuple(Entry(v[5]) for v in VARIANTS), params=BASELINE_PARAMS, label="baseline",
                        threads=THREADS, source_dir=str(HERE))


class Workload:
    """One (requests x context, variant, seq_starts) call of an op: index tensors, cache and
    destination on ``device``. ``lazy`` (the dry run) leaves the cache and destination
    unwritten (torch.empty: no memory touched)."""

    def __init__(self, batch: int, mean: int, variant: tuple, seq_starts: bool, l2: int, seed: int,
                 device: str = "cuda", lazy: bool = False):
        from bench_mla import ragged_lengths
        rng = random.Random(seed)
        self.label, self.op, self.kv_cache_dtype, src_dtype, dst_dtype, self.entry = variant
        self.name = f"{batch}x{mean}"
        self.batch, self.seq = batch, seq_starts
        self.lens = ragged_lengths(rng, batch, mean)
        self.tokens = sum(self.lens)
        self.starts = [rng.randrange(0, max(1, mean)) if seq_starts else 0 for _ in range(batch)]
        blocks_per = [math.ceil((s + n) / BLOCK_SIZE) if n else 0 for s, n in zip(self.starts, self.lens)]
        need = sum(blocks_per)
        self.src_row = ENTRY * torch.empty((), dtype=src_dtype).element_size()
        self.dst_row = ENTRY * torch.empty((), dtype=dst_dtype).element_size()
        num_blocks = max(need, 1, 4 * l2 // (BLOCK_SIZE * self.src_row))
        gen = torch.Generator(device=device).manual_seed(seed)
        shape = (num_blocks, BLOCK_SIZE, ENTRY)
        if lazy:
            self.cache = torch.empty(shape, dtype=src_dtype, device=device)
        else:  # random bytes: every fp8 code (NaN included) and every bf16 bit pattern
            self.cache = torch.randint(0, 256, (num_blocks, BLOCK_SIZE, self.src_row), dtype=torch.uint8,
                                       device=device, generator=gen).view(src_dtype)
        ids = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))[:need].to(torch.int32)
        bt = torch.zeros(batch, max(blocks_per + [1]), dtype=torch.int32)
        k = 0
        for r, nb in enumerate(blocks_per):
            bt[r, :nb] = ids[k:k + nb]
            k += nb
        self.block_table = bt.to(device)
        cu = [0]
        for n in self.lens:
            cu.append(cu[-1] + n)
        self.cu = torch.tensor(cu, dtype=torch.int32, device=device)
        self.seq_starts = torch.tensor(self.starts, dtype=torch.int32, device=device) if seq_starts else None
        self.token_to_seq = torch.zeros(max(1, self.tokens), dtype=torch.int32, device=device)  # not read
        self.scale = torch.tensor([SCALE], dtype=torch.float32, device=device)
        self.dst_dtype, self.device, self.lazy = dst_dtype, device, lazy
        self.moved = self.tokens * (self.src_row + self.dst_row)
        # the baseline's tasks: one per (request, page) with rows, as vLLM's kernels count them
        self.tasks = sum(math.ceil((s + n) / BLOCK_SIZE) - s // BLOCK_SIZE for s, n in zip(self.starts, self.lens) if n)
        self.grid = -(-self.tokens // BLOCK_SIZE) + 2 * batch

    @property
    def title(self) -> str:
        return f"{self.name} {self.label}{' seq_starts' if self.seq else ''}"

    def dst(self) -> torch.Tensor:
        d = torch.empty(self.tokens, ENTRY, dtype=self.dst_dtype, device=self.device)
        if not self.lazy:
            d.view(torch.uint8).fill_(0xA5)
        return d

    def args(self, dst) -> tuple:
        if self.op == "cp_gather_cache":
            return self.cache, dst, self.block_table, self.cu, self.batch, self.seq_starts
        return (self.cache, dst, self.block_table, self.cu, self.token_to_seq, self.tokens, self.kv_cache_dtype,
                self.scale, self.seq_starts)


def baseline(w: Workload, dst: torch.Tensor):
    """A no-argument launch of the vLLM-style kernel (baseline_mla.cu) on ``w`` into
    ``dst``: planned, loaded and bound once, like the op's remembered layout."""
    p = cache_gather.plan_for(w.op, *w.args(dst))
    if p.entry_stride != p.row_bytes or p.dst_row_stride != p.dst_row_bytes or (p.src_ptr | p.dst_ptr) & 15:
        raise ValueError(f"{w.title}: the baseline takes contiguous, 16-byte aligned entries and rows only")
    dev = torch.cuda.current_device()
    image = BASELINE_PARAMS.image(
        src_cache=p.src_ptr, dst=p.dst_ptr, block_table=p.bt_ptr, cu_seq_lens=p.cu_ptr, seq_starts=p.seq_ptr,
        scale=w.scale.data_ptr(), block_stride=p.block_stride, entry_stride=p.entry_stride,
        dst_row_stride=p.dst_row_stride, bt_row_stride=p.bt_row_stride, num_rows=p.num_rows, batch=p.batch,
        block_size=p.block_size, max_blocks=p.max_blocks, row_bytes=p.row_bytes, unused=0)
    go = runtime.load(BASELINE, dev, runtime.current_stream(dev)).launcher(w.entry, w.grid, image)

    def run(_keep=(w, dst)):  # launched on torch's current stream
        go(())
    return run


def _op(w: Workload, dst: torch.Tensor):
    fn = getattr(cache_gather, w.op)
    args = w.args(dst)
    return lambda: fn(*args)


def _targets(row: dict) -> dict:
    """Issue 27's targets of a timed row (bench_mla.timed: its ratios set)."""
    row["target_over_copy"] = TARGET_LARGE if row["tokens"] >= LARGE_TOKENS else TARGET_SMALL
    row["meets_targets"] = row["op_over_copy"] <= row["target_over_copy"] and row["baseline_over_op"] > 1.0
    return row


def workloads(l2: int, device: str = "cuda", lazy: bool = False):
    """Every row's workload, in the record's order (one at a time: each holds a large cache)."""
    from bench_mla import GATHER_WORKLOADS
    for variant in VARIANTS:
        for seq in (False, True):
            for batch, mean in GATHER_WORKLOADS:
                yield Workload(batch, mean, variant, seq, l2, seed=batch * 7 + mean, device=device,
                               lazy=lazy)


def bench_chunked(reps: int | None = None, flush: torch.Tensor | None = None) -> list[dict]:
    """One row per workload: op, baseline and copy interleaved, each checked first."""
    from bench_mla import DEFAULT_REPS, _copy_fns, _first_diff, timed
    from timing import flush_buffer, l2_bytes
    reps = reps or DEFAULT_REPS
    flush = flush_buffer() if flush is None else flush
    rows = []
    for w in workloads(l2_bytes()):
        want = w.dst()
        gather_torch(cache_gather.plan_for(w.op, *w.args(want)), *_torch_args(w, want))
        dst_op, dst_base = w.dst(), w.dst()
        op, base = _op(w, dst_op), baseline(w, dst_base)
        op()
        base()
        torch.cuda.synchronize()
        for who, got in (("op", dst_op), ("baseline", dst_base)):
            if not torch.equal(got.view(torch.uint8), want.view(torch.uint8)):
                raise AssertionError(f"{who} is not byte-exact against the torch path on {w.title}: "
                                     + _first_diff(got, want))
        want = dst_base = None
        gen = torch.Generator(device="cuda").manual_seed(w.batch)
        fns = {"op": op, "baseline": baseline(w, dst_op), "copy": _copy_fns(w.moved, gen)}
        row = {"workload": w.name, "variant": w.label, "seq_starts": w.seq, "requests": w.batch, "tokens": w.tokens,
               "bytes": w.moved}
        rows.append(_targets(timed(row, fns, flush, reps)))
        print(fmt_row(row), flush=True)
        w = fns = op = base = dst_op = None  # free the workload before the next
        torch.cuda.empty_cache()
    return rows


def _torch_args(w: Workload, dst) -> tuple:
    """gather_torch's arguments for ``w`` (src_cache, dst, block_table, cu_seq_lens, seq_starts, scale)."""
    return (w.cache, dst, w.block_table, w.cu, w.seq_starts,
            w.scale if w.kv_cache_dtype not in (None, "auto") else None)


# -- output -------------------------------------------------------------------------------------

HEADER = (f"{'chunked gather':>38} {'tokens':>7} {'copy us':>8} {'op us':>8} {'op/cp':>6} {'base us':>8} "
          f"{'base/cp':>7} {'target':>6}")


def fmt_row(r: dict) -> str:
    title = f"{r['workload']} {r['variant']}{' seq_starts' if r['seq_starts'] else ''}"
    return (f"{title:>38} {r['tokens']:>7} {r['copy_us']:8.1f} {r['op_us']:8.1f} {r['op_over_copy']:5.2f}x "
            f"{r['baseline_us']:8.1f} {r['baseline_over_copy']:6.2f}x {r['target_over_copy']:5.1f}x "
            f"{'ok' if r['meets_targets'] else 'MISSED'}")


def markdown_table(rows: list[dict]) -> list[str]:
    """The record's table of the chunked gathers, as markdown lines."""
    out = ["", "| chunked gather (requests x context) | variant | seq_starts | tokens | MB moved | copy | op "
               "| op / copy | baseline | baseline / copy | target | met | op p10-p90 |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lo, hi = r["op_spread_us"]
        out.append(f"| {r['workload']} | {r['variant']} | {'yes' if r['seq_starts'] else 'no'} | {r['tokens']} | "
                   f"{r['bytes'] / 1e6:.1f} | {r['copy_us']:.1f} | {r['op_us']:.1f} | {r['op_over_copy']:.2f} | "
                   f"{r['baseline_us']:.1f} | {r['baseline_over_copy']:.2f} | {r['target_over_copy']:.1f} | "
                   f"{'yes' if r['meets_targets'] else 'no'} | {lo:.1f}-{hi:.1f} |")
    return out


# -- the dry run (no GPU) -----------------------------------------------------------------------

def dry_run(arch: str = "sm_90") -> list[dict]:
    """Every workload built on the CPU (caches and destinations not touched), the op's full
    checks run on each call, byte counts checked against the tokens the requests cover, the
    baseline's grid checked to hold every task, and the baseline compiled for ``arch``."""
    plans = []
    l2 = 60 << 20  # the H200's L2 (50 MiB or more on the GPUs these rows are for)
    for w in workloads(l2, device="cpu", lazy=True):
        p = cache_gather.plan_for(w.op, *w.args(w.dst()))
        covered = sum(min(w.cu[r + 1].item(), w.tokens) - min(w.cu[r].item(), w.tokens) for r in range(w.batch))
        assert covered == w.tokens == p.num_rows, (w.title, covered, w.tokens, p.num_rows)
        assert w.moved == covered * (p.row_bytes + p.dst_row_bytes), (w.title, w.moved)
        assert w.tasks <= w.grid, (w.title, w.tasks, w.grid)
        assert p.entry_stride == p.row_bytes and p.dst_row_stride == p.dst_row_bytes, w.title
        assert w.tokens < (1 << 20), w.title  # the baseline's 256 threads are vLLM's launch only below
        plans.append({"workload": w.name, "variant": w.label, "seq_starts": w.seq, "tokens": w.tokens,
                      "bytes": w.moved, "conversion": p.conversion, "baseline_grid": w.grid, "tasks": w.tasks})
    image = compiler.compile_module(BASELINE, compiler.Target(arch)).image
    if not image:
        raise AssertionError(f"NVRTC gave no image of {BASELINE.name} for {arch}")
    return plans


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/bench_cache_gather.py", description=__doc__.split("\n")[0],
                                 epilog="The timed run is bench_mla.py's or bench.py's "
                                        "(scripts/gpu_check.sh bench_mla).")
    ap.add_argument("--dry-run", action="store_true", required=True,
                    help="no GPU: build every workload on the CPU, check the plans and byte counts, "
                         "compile the baseline")
    ap.parse_args(argv)
    t0 = time.perf_counter()
    plans = dry_run()
    print(f"dry run: {len(plans)} rows planned, byte counts checked, {BASELINE.name} compiled for sm_90 "
          f"({time.perf_counter() - t0:.1f} s)")
    for p in plans:
        print(f"  {p['workload']:>9} {p['variant']:<18} seq_starts={p['seq_starts']!s:<5} tokens={p['tokens']:<7} "
              f"bytes={p['bytes']:<10} {p['conversion']:<10} grid={p['baseline_grid']} tasks={p['tasks']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
