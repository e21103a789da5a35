"""Side-by-side benchmark of the gather: ``python benchmarks/bench.py OUT_DIR`` on a GPU machine
(with nvrtc_gather importable: installed, or PYTHONPATH=. from a checkout).

For each DeepSeek-V3.2-shaped workload: the op, a contiguous device copy of the same
bytes (the ceiling), a linear-scan baseline kernel (vLLM's approach), the vectorized
torch path and a per-request Python loop. Every implementation is checked bit-exact
against the torch path before it is timed. Timing: warm-up, L2 flushed before every
run, CUDA-event medians. Also: host cost per call, first call on a warm cache in a
fresh process, cold compile. Writes a table, JSON and (with matplotlib) a PNG chart.

It reaches the package only through its public ops and two documented hooks: the ops'
``prepared(..., module=, tokens_per_cta=)`` (run a call as the op does, with another build
or rows-per-block choice) and ``jit.runtime.load`` (load any KernelModule, here the
linear-scan baseline whose source lives beside this file)."""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
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
import types
from pathlib import Path

import torch

from nvrtc_gather.jit import compiler, driver, runtime
from nvrtc_gather.jit.spec import Entry, KernelModule
from nvrtc_gather.kernels import gather as gather_kernels
from nvrtc_gather.ops import gather, indexer_k_quant, paged_layout
from nvrtc_gather.ops.gather_torch import gather_torch
import diagnostics
from timing import flush_buffer, host_costs, l2_bytes, summarize, time_gpu, time_interleaved, time_samples

HERE = Path(__file__).resolve().parent
# vLLM's approach (a linear scan of cu_seq_lens per block), same parameters as the gather.
GATHER = gather_kernels.MODULES[16]
BASELINE_LINEAR_SCAN = KernelModule(name="baseline_linear_scan", source="baseline_linear_scan.cu",
                                    entries=(Entry("baseline_linear_scan"),), params=gather_kernels.PARAMS,
                                    label="baseline", source_dir=str(HERE))
# The op's own build under another name: timing it beside the op measures the noise.
GATHER_CONTROL = dataclasses.replace(GATHER, name="gather_indexer_k_control")
GATHER_VARIANTS = (GATHER_CONTROL,)


def variant_from_source(path: str) -> KernelModule:
    """A build of another gather source file (say, the previous version, saved beside the
    checkout) with the op's entry points, timed beside the op with --gather-variant-source."""
    src = Path(path).resolve()
    return dataclasses.replace(GATHER, name=f"variant_{src.stem}", source=src.name, source_dir=str(src.parent))


HEAD_DIM, QBS, BLOCK_SIZE = 128, 128, 64
NQ = HEAD_DIM // QBS
BYTES_PER_TOKEN = HEAD_DIM + 4 * NQ  # 132 read + 132 written per token

WORKLOADS = [  # (requests, mean tokens per request)
    (8, 131072), (1, 131072), (4, 32768), (64, 2048), (256, 1000),
    (1024, 256), (4096, 64), (16, 2048), (1, 1000), (8, 100),
]


def ragged_lengths(rng: random.Random, batch: int, mean: int) -> list[int]:
    """Lengths around ``mean`` (0.5x..1.5x), about 5% empty when batch > 1; a single request is exact."""
    if batch == 1:
        return [mean]
    return [0 if rng.random() < 0.05 else max(1, round(mean * rng.uniform(0.5, 1.5))) for _ in range(batch)]


class Workload:
    """Tensors of one workload on the GPU: a cache several times the L2, shuffled blocks."""

    def __init__(self, batch: int, mean: int, l2_bytes: int, seed: int = 0):
        rng = random.Random(seed)
        self.name = f"{batch}x{mean}"
        self.lens = ragged_lengths(rng, batch, mean)
        self.tokens = sum(self.lens)
        blocks_per = [math.ceil(n / BLOCK_SIZE) for n in self.lens]
        need = sum(blocks_per)
        block_bytes = BLOCK_SIZE * BYTES_PER_TOKEN
        num_blocks = max(need, (4 * l2_bytes) // block_bytes)
        dev = "cuda"
        self.kv = torch.randint(0, 256, (num_blocks, BLOCK_SIZE, BYTES_PER_TOKEN), dtype=torch.uint8, device=dev)
        ids = torch.randperm(num_blocks, device=dev)[:need].to(torch.int32).cpu().tolist()
        max_blocks = max(blocks_per + [1])
        bt = torch.zeros(batch, max_blocks, dtype=torch.int32)
        k = 0
        for r, nb in enumerate(blocks_per):
            bt[r, :nb] = torch.tensor(ids[k:k + nb], dtype=torch.int32)
            k += nb
        self.block_table = bt.to(dev)
        cu = [0]
        for n in self.lens:
            cu.append(cu[-1] + n)
        self.cu_host = cu
        self.cu = torch.tensor(cu, dtype=torch.int32, device=dev)
        self.blocks_per = blocks_per
        self.bytes_moved = 2 * self.tokens * BYTES_PER_TOKEN

    def outputs(self):
        k = torch.empty(self.tokens, HEAD_DIM, dtype=torch.float8_e4m3fn, device="cuda")
        s = torch.empty(self.tokens, 4 * NQ, dtype=torch.uint8, device="cuda")
        k.view(torch.uint8).fill_(0xA5)
        s.fill_(0xA5)
        return k, s


def _torch_path(w: Workload, k, s):
    gather_torch(gather.plan_gather(w.kv, k, s, w.block_table, w.cu), w.kv, k, s, w.block_table, w.cu)


def _loop_path(w: Workload, k, s):
    """Per-request Python loop, the way engines first wrote it."""
    kv_k, kv_s = paged_layout.views(w.kv, w.kv.size(0), BLOCK_SIZE, w.kv.stride(0), HEAD_DIM, NQ)
    k8 = k.view(torch.uint8)
    for r, n in enumerate(w.lens):
        if n == 0:
            continue
        ids = w.block_table[r, : w.blocks_per[r]]
        a = w.cu_host[r]
        k8[a:a + n] = kv_k[ids].reshape(-1, HEAD_DIM)[:n]
        s[a:a + n] = kv_s[ids].reshape(-1, 4 * NQ)[:n]


def baseline_prepared(w: Workload, k, s):
    """A no-argument launch of the linear-scan baseline on ``w`` into ``k``, ``s``: planned,
    loaded and bound once, like the op's remembered layout (timed calls pay only the launch;
    a plan per call would reach the events through the spin kernel on a slow host)."""
    dev = torch.cuda.current_device()
    p = gather.plan_gather(w.kv, k, s, w.block_table, w.cu)
    per = BASELINE_LINEAR_SCAN.threads // 32
    fields = gather.struct_fields(p)
    names = gather_kernels.PARAMS.pointer_names
    image = gather_kernels.PARAMS.image(**{n: v for n, v in fields.items() if n not in names})
    go = runtime.load(BASELINE_LINEAR_SCAN, dev, runtime.current_stream(dev)).launcher(
        "baseline_linear_scan", (p.num_tokens + per - 1) // per, image)
    pointers = tuple(fields[n] for n in names)

    def run(_keep=(w, k, s)):
        go(pointers)
    return run


def bench_workloads(reps: int, loop_max_batch: int, variants: tuple = (), workloads=WORKLOADS) -> list[dict]:
    """One row per workload; ``variants`` (benchmark builds of GATHER) are checked (but the
    timing-only diagnostics, diagnostics.py) and timed interleaved with the op, as ``<name>_us``."""
    l2, flush = l2_bytes(), flush_buffer()
    rows = []
    for batch, mean in workloads:
        w = Workload(batch, mean, l2, seed=batch * 7 + mean)
        ref_k, ref_s = w.outputs()
        _torch_path(w, ref_k, ref_s)
        impls = {
            "op": lambda k, s: gather.cp_gather_indexer_k_quant_cache(w.kv, k, s, w.block_table, w.cu),
            "baseline": lambda k, s: baseline_prepared(w, k, s)(),
            "torch": lambda k, s: _torch_path(w, k, s),
        }
        if batch <= loop_max_batch:
            impls["loop"] = lambda k, s: _loop_path(w, k, s)
        for m in variants:
            impls[m.name] = lambda k, s, m=m: gather.prepared(w.kv, k, s, w.block_table, w.cu, module=m)()
        row = {"workload": w.name, "requests": batch, "tokens": w.tokens, "bytes": w.bytes_moved}
        outs = {}
        for name, impl in impls.items():
            k, s = outs[name] = w.outputs()
            impl(k, s)
            torch.cuda.synchronize()
            if name.startswith("variant_diag_"):
                continue
            if not (torch.equal(k.view(torch.uint8), ref_k.view(torch.uint8)) and torch.equal(s, ref_s)):
                raise AssertionError(f"{name} is not bit-exact against the torch path on {w.name}")
        src = torch.randint(0, 256, (w.tokens * BYTES_PER_TOKEN,), dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        # Small calls are noisy: more runs for them.
        n = reps if w.tokens >= 100_000 else 5 * reps
        # Every gather kernel is timed writing one pair of output buffers (the same bytes, as
        # checked above), so buffer placement is no difference between them.
        k, s = outs["op"]
        fast = {"op": lambda: impls["op"](k, s), "baseline": baseline_prepared(w, k, s), "copy": lambda: dst.copy_(src)}
        fast.update({m.name: gather.prepared(w.kv, k, s, w.block_table, w.cu, module=m) for m in variants})
        summarize(row, time_samples(fast, flush, n))
        for name in impls.keys() - fast.keys():
            row[f"{name}_us"] = time_gpu(lambda: impls[name](*outs[name]), flush, max(3, reps // 10))
        row["op_over_copy"] = row["op_us"] / row["copy_us"]
        row["baseline_over_op"] = row["baseline_us"] / row["op_us"]
        row["op_GBps"] = w.bytes_moved / row["op_us"] / 1e3
        row["copy_GBps"] = w.bytes_moved / row["copy_us"] / 1e3
        rows.append(row)
        print(_fmt_row(row) + "".join(f"  {m.name} {row[m.name + '_us']:.1f}" for m in variants), flush=True)
        w = src = dst = impls = None  # free the workload before the next one
        torch.cuda.empty_cache()
    return rows


def sweep_tokens_per_cta(values: list[int], reps: int, variants: tuple = ()) -> list[dict]:
    """Op time per workload for several tokens-per-block settings (a runtime parameter),
    and that of each benchmark build in ``variants`` (keys "<tpc>" and "<name> <tpc>")."""
    l2, flush = l2_bytes(), flush_buffer()
    out = []
    for batch, mean in WORKLOADS:
        w = Workload(batch, mean, l2, seed=batch * 7 + mean)
        k, s = w.outputs()
        row = {"workload": w.name}
        args = (w.kv, k, s, w.block_table, w.cu)
        for tpc in values:
            fns = {str(tpc): gather.prepared(*args, tokens_per_cta=tpc)}
            fns.update({f"{m.name} {tpc}": gather.prepared(*args, module=m, tokens_per_cta=tpc) for m in variants})
            row.update(time_interleaved(fns, flush, reps))
        out.append(row)
        print(f"{w.name:>12} " + " ".join(f"{v:8.1f}" for key, v in row.items() if key != "workload"), flush=True)
    return out


def metadata_reads(*tensors):
    """Only the tensor attribute reads validation cannot avoid: its floor."""
    return [(isinstance(t, torch.Tensor), t.dtype, t.shape, t.stride(), t.data_ptr(), t.get_device(), t.is_cuda)
            for t in tensors]


def raw_gather_launch(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens) -> types.SimpleNamespace:
    """The op's launch of this call as raw driver arguments, on a parameter buffer of our own:
    what a launch costs below the op (``raw.launch_ex(cfg_addr, function, params_addr, None)``).
    Fields: raw, function, grid, stream, image, pointers, buf, cfg, cfg_addr, params, params_addr
    (the ctypes objects the addresses point into live as long as the namespace)."""
    dev = torch.cuda.current_device()
    name, grid, fields = gather.launch_config(gather.plan_gather(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens))
    stream = runtime.current_stream(dev)
    function = runtime.load(GATHER, dev, stream).functions[name]
    image = gather_kernels.PARAMS.image(**{n: v for n, v in fields.items() if n not in gather_kernels.PARAMS.pointer_names})
    pointers = tuple(fields[n] for n in image.pointers)
    buf = ctypes.create_string_buffer(image.template, len(image.template))
    image.pack_pointers(buf, 0, *pointers)
    params = (ctypes.c_void_p * 1)(ctypes.addressof(buf))
    cfg = driver.LaunchConfig(grid, 1, 1, GATHER.threads, 1, 1, 0, stream, None, 0)
    return types.SimpleNamespace(raw=driver.raw(), function=function, grid=grid, stream=stream, image=image,
                                 pointers=pointers, buf=buf, cfg=cfg, cfg_addr=ctypes.addressof(cfg), params=params,
                                 params_addr=ctypes.addressof(params))


def host_cost(calls: int = 10000) -> dict:
    """Median µs per call of each op through each entry point users call (the plain function,
    torch.ops.nvrtc_gather.*, and vLLM's torch.ops._C_cache_ops.* after the adapter's
    register()), on small tensors; torch's copy_ of a small tensor as the yardstick and the
    floors under the ops, all measured in one interleaved run (timing.host_costs)."""
    w = Workload(1, 1000, 0, seed=1)
    k, s = w.outputs()
    args = (w.kv, k, s, w.block_table, w.cu)
    kq = torch.randn(1000, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    slots = torch.arange(1000, device="cuda", dtype=torch.int64)
    kv_q = torch.zeros_like(w.kv)
    qargs = (kq, kv_q, slots, QBS, "ue8m0")
    a = torch.empty(1024, device="cuda")
    b = torch.empty(1024, device="cuda")
    from nvrtc_gather.integrations import vllm as vllm_adapter
    vllm_adapter.register()
    vllm_ops = torch.ops._C_cache_ops

    dev = torch.cuda.current_device()
    r = raw_gather_launch(*args)
    raw = r.raw
    cur = ctypes.c_void_p()
    cur_ref = ctypes.byref(cur)
    from bench_mla import HOST_KEYS as MLA_HOST_KEYS, mla_host_calls
    out = host_costs({
        "torch_copy_us": (a.copy_, (b,)),
        "gather_us": (gather.cp_gather_indexer_k_quant_cache, args),
        "write_us": (indexer_k_quant.indexer_k_quant_and_cache, qargs),
        "gather_custom_op_us": (torch.ops.nvrtc_gather.cp_gather_indexer_k_quant_cache, args),
        "write_custom_op_us": (torch.ops.nvrtc_gather.indexer_k_quant_and_cache, qargs),
        "gather_vllm_op_us": (vllm_ops.cp_gather_indexer_k_quant_cache, args),
        "write_vllm_op_us": (vllm_ops.indexer_k_quant_and_cache, qargs),
        "gather_full_checks_us": (gather.plan_gather, args),
        "metadata_reads_us": (metadata_reads, args),
        "current_stream_us": (runtime.current_stream, (dev,)),
        "raw_cuLaunchKernelEx_us": (raw.launch_ex, (r.cfg_addr, r.function, r.params_addr, None)),
        "cuCtxGetCurrent_us": (raw.ctx_get_current, (cur_ref,)),
        "pack_us": (r.image.pack_pointers, (r.buf, 0, *r.pointers)),
        **mla_host_calls(),  # the MLA-cache ops, beside the same yardstick
    }, calls)
    out["calls"] = calls
    for key in ("gather_us", "write_us", "gather_custom_op_us", "write_custom_op_us", "gather_vllm_op_us",
                "write_vllm_op_us") + MLA_HOST_KEYS:
        out[key.replace("_us", "_over_copy")] = round(out[key] / out["torch_copy_us"], 3)
    return out


_FIRST_CALL = r"""
import time, torch
t0 = time.perf_counter()
import nvrtc_gather as ng
from nvrtc_gather.jit import build
kv = torch.randint(0, 256, (64, 64, 132), dtype=torch.uint8, device="cuda")
k = torch.empty(1000, 128, dtype=torch.uint8, device="cuda"); s = torch.empty(1000, 4, dtype=torch.uint8, device="cuda")
bt = torch.arange(16, dtype=torch.int32, device="cuda").view(1, 16); cu = torch.tensor([0, 1000], dtype=torch.int32, device="cuda")
torch.cuda.synchronize()
t1 = time.perf_counter()
if PROFILE:
    import cProfile, pstats, io
    pr = cProfile.Profile(); pr.enable()
ng.cp_gather_indexer_k_quant_cache(kv, k, s, bt, cu); torch.cuda.synchronize()
t2 = time.perf_counter()
if PROFILE:
    pr.disable(); out = io.StringIO(); pstats.Stats(pr, stream=out).sort_stats("cumulative").print_stats(14)
    print("\n".join(l for l in out.getvalue().splitlines() if l.strip())[-3000:])
print((t2 - t1) * 1000, build.stats["compiles"])
"""


def first_calls() -> dict:
    """Cold (empty cache: compile + load) and warm (fresh process, cache filled) first calls."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, NVRTC_GATHER_CACHE_DIR=d)
        out = []
        for i in range(4):
            code = f"PROFILE = {i == 3}\n" + _FIRST_CALL
            r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            ms, compiles = r.stdout.split()[-2:]
            if i == 3:
                print("profile of a warm first call:\n" + r.stdout)
            else:
                out.append((float(ms), int(compiles)))
    target = compiler.pick_target(driver.capability(0))
    t = time.perf_counter()
    compiler.compile_module(GATHER, target)
    compile_ms = (time.perf_counter() - t) * 1000
    return {"cold_first_call_ms": out[0][0], "cold_compiles": out[0][1],
            "warm_first_call_ms": min(o[0] for o in out[1:]), "warm_compiles": out[1][1],
            "nvrtc_compile_ms": compile_ms}


def _fmt_row(r: dict) -> str:
    def f(key):
        v = r.get(key)
        return f"{v:10.1f}" if v is not None else f"{'-':>10}"
    return (f"{r['workload']:>12} {r['tokens']:>9} {f('copy_us')} {f('op_us')} {r['op_over_copy']:6.2f}x "
            f"{f('baseline_us')} {f('torch_us')} {f('loop_us')}")


HEADER = (f"{'workload':>12} {'tokens':>9} {'copy us':>10} {'op us':>10} {'op/cp':>7} "
          f"{'linscan us':>10} {'torch us':>10} {'loop us':>10}")


def markdown(result: dict) -> str:
    """The tables of benchmarks/README.md, from one run's result."""
    env = result["environment"]
    out = [f"{env['gpu']}, CUDA driver {env['driver_cuda']}, torch {env['torch']}, NVRTC {env['nvrtc']}, "
           f"Python {env['python']}, {env['date']}. Median µs, L2 flushed before each run.", "",
           "| requests x mean tokens | tokens | MB moved | copy | op | op / copy | linear scan | torch path "
           "| per-request loop | copy p10-p90 | op p10-p90 | linear scan p10-p90 |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def spread(r, k):
        lo_hi = r.get(f"{k}_spread_us")
        return f"{lo_hi[0]:.1f}-{lo_hi[1]:.1f}" if lo_hi else "-"
    for r in result["workloads"]:
        loop = f"{r['loop_us']:.0f}" if "loop_us" in r else "-"
        out.append(f"| {r['workload']} | {r['tokens']} | {r['bytes'] / 1e6:.1f} | {r['copy_us']:.1f} | "
                   f"{r['op_us']:.1f} | {r['op_over_copy']:.2f} | {r['baseline_us']:.1f} | {r['torch_us']:.0f} | {loop} | "
                   f"{spread(r, 'copy')} | {spread(r, 'op')} | {spread(r, 'baseline')} |")
    if result.get("quant_workloads"):
        out += ["", "| write op workload | tokens | MB moved | copy | op | op / copy | shape | usual shape | "
                "small shape | torch bf16 -> fp8 cast |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in result["quant_workloads"]:
            out.append(f"| {r['workload']} | {r['tokens']} | {r['bytes'] / 1e6:.1f} | {r['copy_us']:.1f} | "
                       f"{r['op_us']:.1f} | {r['op_over_copy']:.2f} | {r['shape']} | {r['shape_usual_us']:.1f} | "
                       f"{r['shape_small_us']:.1f} | {r['cast_us']:.1f} |")
    if result.get("mla_gather_workloads") or result.get("mla_write_workloads") or \
            result.get("chunked_gather_workloads"):
        from bench_mla import markdown_tables
        out += markdown_tables(result)
    h = result["host_cost"]
    out += ["", "| host cost per call (median of 10,000) | µs | / torch copy_ |", "| --- | --- | --- |"]
    out += [f"| {k[:-3].replace('_', ' ')} | {v:.2f} | {h.get(k[:-3] + '_over_copy', '')} |"
            for k, v in h.items() if k.endswith("_us")]
    f = result.get("first_call") or {}
    if f:
        out += ["", f"First call in a fresh process: {f['cold_first_call_ms']:.0f} ms on an empty cache "
                f"({f['cold_compiles']} compile), {f['warm_first_call_ms']:.1f} ms on a warm one "
                f"({f['warm_compiles']} compiles); NVRTC compile of the gather module alone "
                f"{f['nvrtc_compile_ms']:.0f} ms."]
    return "\n".join(out) + "\n"


def environment() -> dict:
    return {
        "gpu": torch.cuda.get_device_name(0),
        "driver_cuda": driver.driver_version(),
        "torch": torch.__version__,
        "nvrtc": "%d.%d" % compiler.nvrtc_version(),
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }


def chart(rows: list[dict], path: Path) -> bool:
    """The PNG chart; False (nothing written) without matplotlib (the `bench` extra)."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["workload"] for r in rows]
    series = [("copy", "copy_us"), ("op", "op_us"), ("linear scan", "baseline_us"), ("torch", "torch_us")]
    fig, ax = plt.subplots(figsize=(11, 5))
    width = 0.2
    for i, (label, key) in enumerate(series):
        ax.bar([x + (i - 1.5) * width for x in range(len(rows))], [r[key] for r in rows], width, label=label)
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)), names, rotation=20)
    ax.set_ylabel("µs (median, L2 flushed)")
    ax.set_title(f"cp_gather_indexer_k_quant_cache on {torch.cuda.get_device_name(0)}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/bench.py", description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="folder for bench.json and bench.png")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--loop-max-batch", type=int, default=1024, help="skip the per-request loop above this batch")
    ap.add_argument("--skip-first-calls", action="store_true")
    ap.add_argument("--skip-quant", action="store_true", help="skip the write-op (indexer_k_quant_and_cache) table")
    ap.add_argument("--skip-mla", action="store_true",
                    help="skip the MLA-cache ops' tables (bench_mla.py: mla_gather_workloads, mla_write_workloads; "
                         "and the chunked gathers')")
    ap.add_argument("--skip-chunked", action="store_true",
                    help="skip the chunked-context gathers' table (bench_cache_gather.py: chunked_gather_workloads)")
    ap.add_argument("--mla-reps", type=int, default=None,
                    help="timed runs per implementation in the MLA tables (default: bench_mla.DEFAULT_REPS)")
    ap.add_argument("--sweep-tpc", default="", help="comma-separated tokens-per-block values to time the op with")
    ap.add_argument("--gather-variants", action="store_true",
                    help="also check and time the benchmark builds of the gather kernel (GATHER_VARIANTS)")
    ap.add_argument("--gather-variant-source", action="append", default=[], metavar="FILE",
                    help="also check and time a build of this gather source (repeatable)")
    ap.add_argument("--gather-diagnostic", action="append", default=[], choices=sorted(diagnostics.DIAGNOSTICS),
                    help="also time a timing-only diagnostic build of the gather (diagnostics.py; not checked)")
    ap.add_argument("--workloads", default="",
                    help="comma-separated gather workloads (BATCHxMEAN, say 1x131072,8x100) instead of all; "
                         "for experiments, not the record")
    ap.add_argument("--tag", default="", help="label stored in the JSON (e.g. the kernel version)")
    ap.add_argument("--host-cost-only", action="store_true", help="only the host cost per call (host_cost.json)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/bench.py: no CUDA GPU visible; the benchmark needs one.", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if args.host_cost_only:
        host = host_cost()
        (args.out / "host_cost.json").write_text(json.dumps({"environment": environment(), "host_cost": host}, indent=2))
        print(json.dumps(host, indent=1))
        return 0
    env = environment()
    print(env)
    print(HEADER)
    variants = (GATHER_VARIANTS if args.gather_variants else ()) + tuple(
        variant_from_source(f) for f in args.gather_variant_source) + tuple(
        diagnostics.diagnostic_module(d) for d in args.gather_diagnostic)
    workloads = [tuple(int(x) for x in w.split("x")) for w in args.workloads.split(",")] if args.workloads \
        else WORKLOADS
    rows = bench_workloads(args.reps, args.loop_max_batch, variants, workloads)
    host = host_cost()
    print(f"host cost per call (median of {host['calls']}), µs: " + ", ".join(
        f"{k[:-3]} {v:.2f}" + (f" ({host[k[:-3] + '_over_copy']}x copy_)" if k[:-3] + "_over_copy" in host else "")
        for k, v in host.items() if k.endswith("_us")), flush=True)
    quant = []
    if not args.skip_quant:
        from bench_quant import bench_quant
        print(f"{'write op':>36} {'tokens':>9} {'copy us':>10} {'op us':>10} {'op/cp':>7}")
        quant = bench_quant(args.reps, flush_buffer())
        for r in quant:
            print(f"{r['workload']:>36} {r['tokens']:>9} {r['copy_us']:10.1f} {r['op_us']:10.1f} "
                  f"{r['op_over_copy']:6.2f}x  (shape {r['shape']}; usual {r['shape_usual_us']:.1f}, "
                  f"small {r['shape_small_us']:.1f}; torch's bf16 -> fp8 cast {r['cast_us']:.1f})", flush=True)
    mla_gathers, mla_writes, chunked = [], [], []
    if not args.skip_mla:
        import bench_mla
        mla_reps = args.mla_reps or bench_mla.DEFAULT_REPS
        mla_flush = flush_buffer()
        print(bench_mla.HEADER)
        mla_gathers = bench_mla.bench_mla_gather(mla_reps, mla_flush)
        print(bench_mla.HEADER.replace("MLA workload", "MLA write"))
        mla_writes = bench_mla.bench_mla_write(mla_reps, mla_flush)
        if not args.skip_chunked:
            import bench_cache_gather
            print(bench_cache_gather.HEADER)
            chunked = bench_cache_gather.bench_chunked(mla_reps, mla_flush)
        mla_flush = None
    sweep = []
    if args.sweep_tpc:
        values = [int(x) for x in args.sweep_tpc.split(",")]
        print(f"op us by tokens per block ({', '.join(m.name for m in variants) or 'no variants'} after the op, "
              f"for each of {values}):")
        sweep = sweep_tokens_per_cta(values, args.reps, variants)
    first = {} if args.skip_first_calls else first_calls()
    if first:
        print(f"first call, fresh process: cold cache {first['cold_first_call_ms']:.0f} ms "
              f"({first['cold_compiles']} compiles), warm cache {first['warm_first_call_ms']:.1f} ms "
              f"({first['warm_compiles']} compiles); NVRTC compile alone {first['nvrtc_compile_ms']:.0f} ms")
    result = {"environment": env, "workloads": rows, "quant_workloads": quant, "host_cost": host,
              "mla_gather_workloads": mla_gathers, "mla_write_workloads": mla_writes,
              "chunked_gather_workloads": chunked,
              "first_call": first, "sweep_tpc": sweep,
              "shape": {"head_dim": HEAD_DIM, "quant_block_size": QBS, "block_size": BLOCK_SIZE}}
    if args.tag:
        result["tag"] = args.tag
    (args.out / "bench.json").write_text(json.dumps(result, indent=2))
    (args.out / "bench.md").write_text(markdown(result))
    if chart(rows, args.out / "bench.png"):
        print(f"wrote {args.out / 'bench.json'}, bench.md and bench.png")
    else:
        print(f"wrote {args.out / 'bench.json'} and bench.md; the chart (bench.png) needs matplotlib: "
              "pip install 'nvrtc-gather[bench]' (or pip install matplotlib)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
