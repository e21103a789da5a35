"""The indexer cache's family: cp_gather_indexer_k_quant_cache (the gather) and
indexer_k_quant_and_cache (the write), on DeepSeek-V3.2 shapes (head_dim 128, quant block 128,
64-token blocks: 132 bytes per token, read and written by the gather; the write reads 256 bytes
of bf16 k and writes 132).

The gather, per workload: the op, a contiguous device copy of the same bytes (the ceiling), a
linear-scan baseline kernel (vLLM's approach, baseline_linear_scan.cu), the vectorized torch
path and a per-request Python loop, each checked bit-exact against the torch path first. The
write: the op and the op forced to each shape of its vector kernels (usual: 4 tokens per lane,
small: 2), checked against the torch path on a poisoned cache, beside the copy and torch's own
bf16 -> fp8 cast of k (the op's mix of bytes without scales or slots). "scattered" slots are
random over the cache (the worst case), "paged" fill shuffled blocks in order (a prefill).

It reaches the package through the public ops, their ``plan_*`` / ``prepared(..., module=,
tokens_per_cta=, shape=)`` hooks, and the baseline through baselines.py."""
from __future__ import annotations

import ctypes
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
import types

import torch

import baselines
import paged_batch as pb
from record import Table, mb, num, spread
from timing import check_same, copy_fn, l2_bytes, time_gpu, timed
from nvrtc_gather.jit import compiler, driver, runtime
from nvrtc_gather.kernels import gather as gather_kernels
from nvrtc_gather.ops import gather, indexer_k_quant, paged_layout
from nvrtc_gather.ops.gather_torch import gather_torch
from nvrtc_gather.ops.indexer_k_quant_torch import quant_torch

NAME, REPS = "indexer", 100
HEAD_DIM, QBS = 128, 128
NQ = HEAD_DIM // QBS
BYTES_PER_TOKEN = HEAD_DIM + 4 * NQ  # 132: the cache's record, the gather's output
GATHER = gather_kernels.MODULES[16]
# The op's own build under another name: timing it beside the op measures the noise.
GATHER_CONTROL = dataclasses.replace(GATHER, name="gather_indexer_k_control")

GATHER_WORKLOADS = [  # (requests, mean tokens per request)
    (8, 131072), (1, 131072), (4, 32768), (64, 2048), (256, 1000),
    (1024, 256), (4096, 64), (16, 2048), (1, 1000), (8, 100),
]
WRITE_WORKLOADS = [  # (tokens, slot pattern, scale_fmt)
    (1024, "scattered", "ue8m0"), (16384, "scattered", "ue8m0"), (131072, "scattered", "ue8m0"),
    (1 << 20, "scattered", "ue8m0"), (1 << 20, "scattered", "fp8_e4m3"),
    (1024, "paged", "ue8m0"), (16384, "paged", "ue8m0"), (131072, "paged", "ue8m0"), (1 << 20, "paged", "ue8m0"),
    (1 << 20, "paged", "fp8_e4m3"),
]
SHAPE_KEYS = {"": "shape_usual", "small": "shape_small"}


def add_options(ap) -> None:
    ap.add_argument("--loop-max-batch", type=int, default=1024, help="skip the per-request loop above this batch")
    ap.add_argument("--skip-quant", action="store_true", help="skip the write op's table (quant_workloads)")
    ap.add_argument("--gather-variants", action="store_true",
                    help="also check and time the op's kernel built under another name (the noise)")
    ap.add_argument("--workloads", default="",
                    help="comma-separated gather workloads (BATCHxMEAN, say 1x131072,8x100) instead of all; "
                         "for experiments, not the record")


class GatherWorkload(pb.Batch):
    """One gather's requests and cache (random bytes, or unwritten when ``lazy``) on ``device``."""

    def __init__(self, batch: int, mean: int, l2: int, seed: int, device: str = "cuda", lazy: bool = False):
        super().__init__(batch, mean, pb.BLOCK_SIZE * BYTES_PER_TOKEN, l2, seed, device)
        self.kv = pb.cache(self.num_blocks, BYTES_PER_TOKEN, seed, device, lazy)
        self.device, self.lazy, self.bytes_moved = device, lazy, 2 * self.tokens * BYTES_PER_TOKEN

    def outputs(self):
        k = torch.empty(self.tokens, HEAD_DIM, dtype=torch.float8_e4m3fn, device=self.device)
        s = torch.empty(self.tokens, 4 * NQ, dtype=torch.uint8, device=self.device)
        if not self.lazy:
            k.view(torch.uint8).fill_(0xA5)
            s.fill_(0xA5)
        return k, s

    def args(self, k, s) -> tuple:
        return self.kv, k, s, self.block_table, self.cu


def _torch_path(w: GatherWorkload, k, s):
    gather_torch(gather.plan_gather(*w.args(k, s)), *w.args(k, s))


def _loop_path(w: GatherWorkload, k, s):
    """Per-request Python loop, the way engines first wrote it."""
    kv_k, kv_s = paged_layout.views(w.kv, w.kv.size(0), pb.BLOCK_SIZE, w.kv.stride(0), HEAD_DIM, NQ)
    k8 = k.view(torch.uint8)
    for r, n in enumerate(w.lens):
        if n:
            ids, a = w.block_table[r, : w.blocks_per[r]], w.cu_host[r]
            k8[a:a + n] = kv_k[ids].reshape(-1, HEAD_DIM)[:n]
            s[a:a + n] = kv_s[ids].reshape(-1, 4 * NQ)[:n]


def baseline_prepared(w: GatherWorkload, k, s):
    """A no-argument launch of the linear-scan baseline on ``w`` into ``k``, ``s``: planned,
    loaded and bound once, like the op's remembered layout."""
    fields, names = gather.struct_fields(gather.plan_gather(*w.args(k, s))), gather_kernels.PARAMS.pointer_names
    per = baselines.LINEAR_SCAN.threads // 32
    return baselines.bound(baselines.LINEAR_SCAN, "baseline_linear_scan", -(-fields["num_tokens"] // per), (w, k, s),
                           tuple(fields[n] for n in names), **{n: v for n, v in fields.items() if n not in names})


def _gathers(opts, reps: int, flush) -> list[dict]:
    variants = (GATHER_CONTROL,) if opts.gather_variants else ()
    workloads = [tuple(map(int, x.split("x"))) for x in opts.workloads.split(",")] if opts.workloads \
        else GATHER_WORKLOADS
    print("\n".join(GATHER_TABLE.header()), flush=True)
    rows = []
    for batch, mean in workloads:
        w = GatherWorkload(batch, mean, l2_bytes(), seed=batch * 7 + mean)
        ref_k, ref_s = w.outputs()
        _torch_path(w, ref_k, ref_s)
        impls = {"op": lambda k, s: gather.cp_gather_indexer_k_quant_cache(*w.args(k, s)),
                 "baseline": lambda k, s: baseline_prepared(w, k, s)(), "torch": lambda k, s: _torch_path(w, k, s)}
        if batch <= opts.loop_max_batch:
            impls["loop"] = lambda k, s: _loop_path(w, k, s)
        for m in variants:
            impls[m.name] = lambda k, s, m=m: gather.prepared(*w.args(k, s), module=m)()
        outs = {}
        for name, impl in impls.items():
            k, s = outs[name] = w.outputs()
            impl(k, s)
            torch.cuda.synchronize()
            check_same(name, k, ref_k, w.name)
            check_same(name, s, ref_s, w.name)
        # every gather kernel writes one pair of buffers (the same bytes): placement is no difference
        k, s = outs["op"]
        fast = {"op": lambda: impls["op"](k, s), "baseline": baseline_prepared(w, k, s), "copy": copy_fn(w.bytes_moved)}
        fast.update({m.name: gather.prepared(*w.args(k, s), module=m) for m in variants})
        row = {"workload": w.name, "requests": batch, "tokens": w.tokens, "bytes": w.bytes_moved}
        timed(row, fast, flush, reps, small_factor=5)
        for name in impls.keys() - fast.keys():  # the torch path and the loop: slow, fewer runs
            row[f"{name}_us"] = time_gpu(lambda: impls[name](*outs[name]), flush, max(3, reps // 10))
        rows.append(row)
        print(GATHER_TABLE.line(row) + "".join(f"  {m.name} {row[m.name + '_us']:.1f}" for m in variants), flush=True)
        w = impls = outs = fast = None  # free the workload before the next one
        torch.cuda.empty_cache()
    return rows


def _write_case(tokens: int, pattern: str, fmt: str, l2: int, device: str = "cuda", lazy: bool = False):
    """The write's k, cache and slots: a cache at least 4x the L2 and 4x the tokens' blocks."""
    num_blocks = pb.cache_blocks(4 * -(-tokens // pb.BLOCK_SIZE), pb.BLOCK_SIZE * BYTES_PER_TOKEN, l2)
    kv = pb.cache(num_blocks, BYTES_PER_TOKEN, tokens, device, lazy)
    slots = pb.slots(tokens, num_blocks, pattern, tokens, device)
    k = torch.empty(tokens, HEAD_DIM, dtype=torch.bfloat16, device=device) if lazy else \
        torch.randn(tokens, HEAD_DIM, device=device, generator=torch.Generator(device).manual_seed(tokens)).bfloat16()
    return (k, kv, slots, QBS, fmt), tokens * (HEAD_DIM * 2 + BYTES_PER_TOKEN)


def _writes(reps: int, flush) -> list[dict]:
    print("\n".join(WRITE_TABLE.header()), flush=True)
    rows = []
    for tokens, pattern, fmt in WRITE_WORKLOADS:
        args, moved = _write_case(tokens, pattern, fmt, l2_bytes())
        k, kv, slots = args[:3]
        fns = {"op": lambda: indexer_k_quant.indexer_k_quant_and_cache(*args)}
        fns.update({key: indexer_k_quant.prepared(*args, shape=shape) for shape, key in SHAPE_KEYS.items()})
        # poisoned: before each build runs, every byte the torch path writes holds its complement
        want = kv.clone()
        quant_torch(indexer_k_quant.plan_quant(k, want, slots, QBS, fmt), k, want, slots)
        poison = torch.bitwise_not(want)
        expected = poison.clone()
        quant_torch(indexer_k_quant.plan_quant(k, expected, slots, QBS, fmt), k, expected, slots)
        name = f"quant {tokens} {pattern} {fmt}"
        for who, fn in fns.items():
            kv.copy_(poison)
            fn()
            torch.cuda.synchronize()
            check_same(who, kv, expected, name)
        want = poison = expected = None
        k8 = torch.empty(k.shape, dtype=torch.float8_e4m3fn, device="cuda")
        fns.update(copy=copy_fn(moved), cast=lambda: k8.copy_(k))
        row = {"workload": name, "tokens": tokens, "bytes": moved,
               "shape": indexer_k_quant.call_shape(indexer_k_quant.plan_quant(*args)) or "usual"}
        rows.append(timed(row, fns, flush, reps, small_factor=5))
        print(WRITE_TABLE.line(row), flush=True)
        args = k = kv = slots = k8 = fns = None  # free this workload before the next
        torch.cuda.empty_cache()
    return rows


_FIRST_CALL = r"""
import time, torch
import nvrtc_gather as ng
from nvrtc_gather.jit import build
kv = torch.randint(0, 256, (64, 64, 132), dtype=torch.uint8, device="cuda")
k = torch.empty(1000, 128, dtype=torch.uint8, device="cuda"); s = torch.empty(1000, 4, dtype=torch.uint8, device="cuda")
bt = torch.arange(16, dtype=torch.int32, device="cuda").view(1, 16); cu = torch.tensor([0, 1000], dtype=torch.int32, device="cuda")
torch.cuda.synchronize()
t1 = time.perf_counter()
ng.cp_gather_indexer_k_quant_cache(kv, k, s, bt, cu); torch.cuda.synchronize()
print((time.perf_counter() - t1) * 1000, build.stats["compiles"])
"""


def first_calls() -> dict:
    """The gather's first call in a fresh process: on an empty cache (compile + load), then
    twice on the cache that filled (the faster kept); and NVRTC's compile of its module alone."""
    with tempfile.TemporaryDirectory() as d:
        runs = [subprocess.run([sys.executable, "-c", _FIRST_CALL], env=dict(os.environ, NVRTC_GATHER_CACHE_DIR=d),
                               capture_output=True, text=True, check=True).stdout.split()[-2:] for _ in range(3)]
    t = compiler.pick_target(driver.capability(0))
    t0 = time.perf_counter()
    compiler.compile_module(GATHER, t)
    return {"cold_first_call_ms": float(runs[0][0]), "cold_compiles": int(runs[0][1]),
            "warm_first_call_ms": min(float(r[0]) for r in runs[1:]), "warm_compiles": int(runs[1][1]),
            "nvrtc_compile_ms": (time.perf_counter() - t0) * 1000}


def bench(opts, reps: int, flush) -> dict:
    """The record's entries of this family: its rows (checked, then timed) and first calls."""
    out = {"workloads": _gathers(opts, reps, flush), "quant_workloads": [] if opts.skip_quant else _writes(reps, flush),
           "first_call": {} if opts.skip_first_calls else first_calls(),
           "shape": {"head_dim": HEAD_DIM, "quant_block_size": QBS, "block_size": pb.BLOCK_SIZE}}
    if out["first_call"]:
        print(first_call_line(out["first_call"]), flush=True)
    return out


def dry_run(l2: int = 60 << 20) -> dict:
    """Every row's workload built on the CPU (caches and outputs unwritten) and planned by the
    op's full checks; the baseline compiled for sm_90. Each row's identity, by section."""
    gathers = []
    for batch, mean in GATHER_WORKLOADS:
        w = GatherWorkload(batch, mean, l2, seed=batch * 7 + mean, device="cpu", lazy=True)
        assert gather.plan_gather(*w.args(*w.outputs())).num_tokens == w.tokens, w.name
        gathers.append({"workload": w.name, "requests": batch, "tokens": w.tokens, "bytes": w.bytes_moved})
    writes = []
    for tokens, pattern, fmt in WRITE_WORKLOADS:
        args, moved = _write_case(tokens, pattern, fmt, l2, device="cpu", lazy=True)
        assert indexer_k_quant.plan_quant(*args).num_tokens == tokens
        writes.append({"workload": f"quant {tokens} {pattern} {fmt}", "tokens": tokens, "bytes": moved})
    assert compiler.compile_module(baselines.LINEAR_SCAN, compiler.Target("sm_90")).image
    return {"workloads": gathers, "quant_workloads": writes}


def raw_gather_launch(*args) -> types.SimpleNamespace:
    """The op's launch of a gather call as raw driver arguments, on a parameter buffer of our
    own: what a launch costs below the op (``raw.launch_ex(cfg_addr, function, params_addr, None)``)."""
    dev = torch.cuda.current_device()
    name, grid, fields = gather.launch_config(gather.plan_gather(*args))
    stream = runtime.current_stream(dev)
    function = runtime.load(GATHER, dev, stream).functions[name]
    image = gather_kernels.PARAMS.image(**{n: v for n, v in fields.items() if n not in gather_kernels.PARAMS.pointer_names})
    pointers = tuple(fields[n] for n in image.pointers)
    buf = ctypes.create_string_buffer(image.template, len(image.template))
    image.pack_pointers(buf, 0, *pointers)
    params = (ctypes.c_void_p * 1)(ctypes.addressof(buf))
    cfg = driver.LaunchConfig(grid, 1, 1, GATHER.threads, 1, 1, 0, stream, None, 0)
    return types.SimpleNamespace(raw=driver.raw(), function=function, image=image, pointers=pointers, buf=buf,
                                 cfg=cfg, cfg_addr=ctypes.addressof(cfg), params=params,
                                 params_addr=ctypes.addressof(params))


def metadata_reads(*tensors):
    """Only the tensor attribute reads validation cannot avoid: its floor."""
    return [(isinstance(t, torch.Tensor), t.dtype, t.shape, t.stride(), t.data_ptr(), t.get_device(), t.is_cuda)
            for t in tensors]


_KEEP = []
HOST_RATIOS = ("gather_us", "write_us", "gather_custom_op_us", "write_custom_op_us", "gather_vllm_op_us",
               "write_vllm_op_us")


def host_calls() -> dict:
    """The calls whose host cost is measured (``name_us: (fn, args)``, timing.host_costs): each
    op through the plain function, torch.ops.nvrtc_gather.* and vLLM's torch.ops._C_cache_ops.*
    (after the adapter's register()), on small tensors; the gather's full checks (plan_gather:
    what a call with a new layout pays first) and the floors under a launch."""
    from nvrtc_gather.integrations import vllm as vllm_adapter
    w = GatherWorkload(1, 1000, 0, seed=1)
    args = w.args(*w.outputs())
    qargs = (torch.randn(1000, HEAD_DIM, device="cuda", dtype=torch.bfloat16), torch.zeros_like(w.kv),
             torch.arange(1000, device="cuda", dtype=torch.int64), QBS, "ue8m0")
    vllm_adapter.register()
    ops, vllm_ops, r = torch.ops.nvrtc_gather, torch.ops._C_cache_ops, raw_gather_launch(*args)
    cur = ctypes.c_void_p()
    _KEEP.append((r, cur))  # what the raw launch's addresses point into
    return {
        "gather_us": (gather.cp_gather_indexer_k_quant_cache, args),
        "write_us": (indexer_k_quant.indexer_k_quant_and_cache, qargs),
        "gather_custom_op_us": (ops.cp_gather_indexer_k_quant_cache, args),
        "write_custom_op_us": (ops.indexer_k_quant_and_cache, qargs),
        "gather_vllm_op_us": (vllm_ops.cp_gather_indexer_k_quant_cache, args),
        "write_vllm_op_us": (vllm_ops.indexer_k_quant_and_cache, qargs),
        "gather_full_checks_us": (gather.plan_gather, args),
        "metadata_reads_us": (metadata_reads, args),
        "current_stream_us": (runtime.current_stream, (torch.cuda.current_device(),)),
        "raw_cuLaunchKernelEx_us": (r.raw.launch_ex, (r.cfg_addr, r.function, r.params_addr, None)),
        "cuCtxGetCurrent_us": (r.raw.ctx_get_current, (ctypes.byref(cur),)),
        "pack_us": (r.image.pack_pointers, (r.buf, 0, *r.pointers)),
    }


GATHER_TABLE = Table("workloads", [
    ("requests x mean tokens", num("workload", "")), ("tokens", num("tokens", "")), ("MB moved", mb),
    ("copy", num("copy_us")), ("op", num("op_us")), ("op / copy", num("op_over_copy", ".2f")),
    ("linear scan", num("baseline_us")), ("torch path", num("torch_us", ".0f")),
    ("per-request loop", num("loop_us", ".0f")), ("copy p10-p90", spread("copy")), ("op p10-p90", spread("op")),
    ("linear scan p10-p90", spread("baseline"))])
WRITE_TABLE = Table("quant_workloads", [
    ("write op workload", num("workload", "")), ("tokens", num("tokens", "")), ("MB moved", mb),
    ("copy", num("copy_us")), ("op", num("op_us")), ("op / copy", num("op_over_copy", ".2f")),
    ("shape", num("shape", "")), ("usual shape", num("shape_usual_us")), ("small shape", num("shape_small_us")),
    ("torch bf16 -> fp8 cast", num("cast_us"))])


def first_call_line(f: dict) -> str:
    return (f"First call in a fresh process: {f['cold_first_call_ms']:.0f} ms on an empty cache "
            f"({f['cold_compiles']} compile), {f['warm_first_call_ms']:.1f} ms on a warm one "
            f"({f['warm_compiles']} compiles); NVRTC compile of the gather module alone {f['nvrtc_compile_ms']:.0f} ms.")


def markdown(record: dict) -> list[str]:
    out = GATHER_TABLE.lines(record) + WRITE_TABLE.lines(record)
    return out + (["", first_call_line(record["first_call"])] if record.get("first_call") else [])
