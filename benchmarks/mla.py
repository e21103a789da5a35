"""The MLA cache's family: cp_gather_and_upconvert_fp8_kv_cache (the gather to bf16) and
concat_and_cache_mla (the fp8_ds_mla write), each against a contiguous device copy of the same
bytes (the ceiling) and a vLLM-style baseline kernel (baseline_mla.cu).

DeepSeek shapes: 64-token blocks of 656-byte records (512 fp8 codes, 4 fp32 tile scales, 64
bf16 k_pe values), bf16 rows of 576 values. The gather reads 656 B and writes 1152 B per token;
the write reads 1152 B (kv_c 512 + k_pe 64 bf16 values) and writes 656 B.

Every implementation is checked bit-exact before it is timed: the op against the torch path
(run on the GPU), the baselines against the op (the write baseline uses vLLM's older tile-scale
rule, so against ``ds_scale_rule="plain"``). It reaches the package through the public ops,
their ``plan_*`` hooks, and the baselines through baselines.py."""
from __future__ import annotations

import torch

import baselines
import paged_batch as pb
from record import Table, mb, num, spread
from timing import check_same, copy_fn, l2_bytes, timed
from nvrtc_gather.jit import compiler
from nvrtc_gather.ops import mla_gather, mla_write
from nvrtc_gather.ops.mla_gather_torch import gather_torch
from nvrtc_gather.ops.mla_write_torch import write_torch

NAME, REPS = "mla", 40
RECORD = 656            # bytes per cached token
ROW = 576               # bf16 values per gathered row
NOPE, ROPE = 512, 64
WRITE_READ = 2 * (NOPE + ROPE)  # 1152 bytes of bf16 input per token

GATHER_WORKLOADS = [  # (requests, mean context tokens per request)
    (1, 65536), (1, 131072), (8, 16384), (64, 2048), (256, 1000), (1024, 256), (4096, 64), (1, 1000), (8, 100),
]
WRITE_WORKLOADS = [  # (tokens, slot pattern)
    (1024, "paged"), (1024, "scattered"), (16384, "paged"), (131072, "paged"), (1 << 20, "paged"),
    (1 << 20, "scattered"),
]


class GatherWorkload(pb.Batch):
    """One gather's requests and cache; workspace_starts = cu_seq_lens, no seq_starts."""

    def __init__(self, batch: int, mean: int, l2: int, seed: int, device: str = "cuda", lazy: bool = False):
        super().__init__(batch, mean, pb.BLOCK_SIZE * RECORD, l2, seed, device)
        self.cache = pb.cache(self.num_blocks, RECORD, seed, device, lazy)
        self.device, self.lazy, self.moved = device, lazy, self.tokens * (RECORD + 2 * ROW)

    def dst(self) -> torch.Tensor:
        d = torch.empty(self.tokens, ROW, dtype=torch.bfloat16, device=self.device)
        return d if self.lazy else d.view(torch.uint8).fill_(0xA5).view(torch.bfloat16)

    def args(self, dst) -> tuple:
        return self.cache, dst, self.block_table, self.cu, self.batch


def gather_baseline(w: GatherWorkload, dst: torch.Tensor):
    """A no-argument launch of the vLLM-style gather on ``w`` into ``dst``, bound once (w.cu:
    batch + 1 row offsets, the op's workspace_starts and the row count)."""
    p = mla_gather.plan_gather(*w.args(dst))
    grid = baselines.page_task_grid(p.num_rows, p.block_size, p.batch)
    return baselines.bound(baselines.MLA_GATHER, "baseline_mla_gather", grid, (w, dst),
                           **baselines.page_tasks(p, w.cu.data_ptr()))


def _gathers(reps: int, flush) -> list[dict]:
    print("\n".join(GATHER_TABLE.header()), flush=True)
    rows = []
    for batch, mean in GATHER_WORKLOADS:
        w = GatherWorkload(batch, mean, l2_bytes(), seed=batch * 7 + mean)
        want, dst_op, dst_base = w.dst(), w.dst(), w.dst()
        gather_torch(mla_gather.plan_gather(*w.args(want)), *w.args(want)[:4], None)
        op = lambda: mla_gather.cp_gather_and_upconvert_fp8_kv_cache(*w.args(dst_op))  # noqa: E731
        op()
        gather_baseline(w, dst_base)()
        torch.cuda.synchronize()
        check_same("mla gather op", dst_op, want, w.name)
        check_same("mla gather baseline", dst_base, want, w.name)
        want = dst_base = None
        plan = mla_gather.plan_gather(*w.args(dst_op))
        fns = {"op": op, "baseline": gather_baseline(w, dst_op), "copy": copy_fn(w.moved)}
        row = {"workload": w.name, "requests": batch, "tokens": w.tokens, "bytes": w.moved,
               "rows_per_cta": plan.rows_per_cta, "vec": plan.vec}
        rows.append(timed(row, fns, flush, reps))
        print(GATHER_TABLE.line(row), flush=True)
        w = fns = op = dst_op = None  # free the workload before the next
        torch.cuda.empty_cache()
    return rows


class WriteWorkload:
    def __init__(self, tokens: int, pattern: str, l2: int, seed: int, device: str = "cuda", lazy: bool = False):
        self.name, self.tokens = f"{tokens} {pattern}", tokens
        self.requests = 1 if pattern == "paged" else tokens
        num_blocks = pb.cache_blocks(4 * -(-tokens // pb.BLOCK_SIZE), pb.BLOCK_SIZE * RECORD, l2)
        self.cache = pb.cache(num_blocks, RECORD, seed, device, lazy)
        self.slots = pb.slots(tokens, num_blocks, pattern, seed, device)
        gen = torch.Generator(device).manual_seed(seed)
        self.kv_c, self.k_pe = (torch.empty(tokens, n, dtype=torch.bfloat16, device=device) if lazy else
                                torch.randn(tokens, n, device=device, generator=gen).bfloat16() for n in (NOPE, ROPE))
        self.scale = torch.ones(1, dtype=torch.float32, device=device)
        self.moved = tokens * (WRITE_READ + RECORD)

    def args(self, cache, rule="pow2"):
        return self.kv_c, self.k_pe, cache, self.slots, "fp8_ds_mla", self.scale, False, rule


def write_baseline(w: WriteWorkload, cache: torch.Tensor):
    """A no-argument launch of the vLLM-style write on ``w`` into ``cache``, bound once."""
    p = mla_write.plan_write(*w.args(cache))
    return baselines.bound(
        baselines.MLA_WRITE, "baseline_mla_write", p.num_tokens, (w, cache), kv_c=p.kv_c_ptr, k_pe=p.k_pe_ptr,
        slot_mapping=p.slot_ptr, kv_cache=p.kv_ptr, kv_c_row_stride=p.kv_c_row_stride,
        k_pe_row_stride=p.k_pe_row_stride, block_stride=p.block_stride, entry_stride=p.entry_stride,
        num_tokens=p.num_tokens, block_size=p.block_size)


def _writes(reps: int, flush) -> list[dict]:
    """The op (ds_scale_rule "pow2", the default, and "plain", the baseline's rule), the
    baseline and the copy, interleaved."""
    print("\n".join(WRITE_TABLE.header()), flush=True)
    rows = []
    for tokens, pattern in WRITE_WORKLOADS:
        w = WriteWorkload(tokens, pattern, l2_bytes(), seed=tokens + (pattern == "paged"))
        want, got = w.cache.clone(), w.cache.clone()
        write_torch(mla_write.plan_write(*w.args(want)), w.kv_c, w.k_pe, want, w.slots, w.scale)
        mla_write.concat_and_cache_mla(*w.args(got))
        torch.cuda.synchronize()
        check_same("mla write op", got, want, w.name)
        got.copy_(w.cache)
        mla_write.concat_and_cache_mla(*w.args(got, "plain"))
        base = w.cache.clone()
        write_baseline(w, base)()
        torch.cuda.synchronize()
        check_same("mla write baseline (against the op's ds_scale_rule='plain')", base, got, w.name)
        want = base = None
        cache = got  # every implementation writes this one cache (same bytes, same placement)
        fns = {"op": lambda: mla_write.concat_and_cache_mla(*w.args(cache)),
               "op_plain": lambda: mla_write.concat_and_cache_mla(*w.args(cache, "plain")),
               "baseline": write_baseline(w, cache), "copy": copy_fn(w.moved)}
        row = {"workload": w.name, "requests": w.requests, "tokens": tokens, "bytes": w.moved,
               "vec": mla_write.plan_write(*w.args(cache)).vec}
        rows.append(timed(row, fns, flush, reps))
        print(WRITE_TABLE.line(row), flush=True)
        w = fns = cache = got = None
        torch.cuda.empty_cache()
    return rows


def bench(opts, reps: int, flush) -> dict:
    return {"mla_gather_workloads": _gathers(reps, flush), "mla_write_workloads": _writes(reps, flush)}


def dry_run(l2: int = 60 << 20) -> dict:
    """Every row's workload built on the CPU and planned by the op's full checks; the baselines
    compiled for sm_90. Each row's identity, by section."""
    gathers, writes = [], []
    for batch, mean in GATHER_WORKLOADS:
        w = GatherWorkload(batch, mean, l2, seed=batch * 7 + mean, device="cpu", lazy=True)
        assert mla_gather.plan_gather(*w.args(w.dst())).num_rows == w.tokens, w.name
        gathers.append({"workload": w.name, "requests": batch, "tokens": w.tokens, "bytes": w.moved})
    for tokens, pattern in WRITE_WORKLOADS:
        w = WriteWorkload(tokens, pattern, l2, seed=tokens + (pattern == "paged"), device="cpu", lazy=True)
        assert mla_write.plan_write(*w.args(w.cache)).num_tokens == tokens, w.name
        writes.append({"workload": w.name, "requests": w.requests, "tokens": tokens, "bytes": w.moved})
    for m in (baselines.MLA_GATHER, baselines.MLA_WRITE):
        assert compiler.compile_module(m, compiler.Target("sm_90")).image, m.name
    return {"mla_gather_workloads": gathers, "mla_write_workloads": writes}


HOST_RATIOS = ("mla_write_us", "mla_write_custom_op_us", "mla_gather_us", "mla_gather_custom_op_us")


def host_calls() -> dict:
    """Both ops through the plain function and torch.ops.nvrtc_gather.*, on small tensors (1000
    tokens; one request of 1000), and each op's full checks (plan_*: what a call with a new
    layout pays first)."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    n = 1000
    cache = torch.randint(0, 256, (64, pb.BLOCK_SIZE, RECORD), dtype=torch.uint8, device="cuda", generator=gen)
    kv_c, k_pe = (torch.randn(n, d, device="cuda", generator=gen).bfloat16() for d in (NOPE, ROPE))
    wargs = (kv_c, k_pe, cache, torch.arange(n, device="cuda", dtype=torch.int64), "fp8_ds_mla",
             torch.ones(1, device="cuda"))
    gargs = (cache, torch.empty(n, ROW, dtype=torch.bfloat16, device="cuda"),
             torch.arange(16, dtype=torch.int32, device="cuda").view(1, 16), torch.zeros(1, dtype=torch.int32,
                                                                                         device="cuda"), 1)
    ops = torch.ops.nvrtc_gather
    return {
        "mla_write_us": (mla_write.concat_and_cache_mla, wargs),
        "mla_write_custom_op_us": (ops.concat_and_cache_mla, wargs),
        "mla_gather_us": (mla_gather.cp_gather_and_upconvert_fp8_kv_cache, gargs),
        "mla_gather_custom_op_us": (ops.cp_gather_and_upconvert_fp8_kv_cache, gargs),
        "mla_write_full_checks_us": (mla_write.plan_write, wargs),
        "mla_gather_full_checks_us": (mla_gather.plan_gather, gargs),
    }


_COLUMNS = [("requests", num("requests", "")), ("tokens", num("tokens", "")), ("MB moved", mb),
            ("copy", num("copy_us")), ("op", num("op_us")), ("op / copy", num("op_over_copy", ".2f")),
            ("baseline", num("baseline_us")), ("baseline / copy", num("baseline_over_copy", ".2f")),
            ("op p10-p90", spread("op")), ("baseline p10-p90", spread("baseline"))]
GATHER_TABLE = Table("mla_gather_workloads", [("MLA gather (requests x context)", num("workload", ""))] + _COLUMNS)
WRITE_TABLE = Table("mla_write_workloads", [("MLA write fp8_ds_mla", num("workload", ""))] + _COLUMNS
                    + [("op, plain scale rule", num("op_plain_us"))])


def markdown(record: dict) -> list[str]:
    return GATHER_TABLE.lines(record) + WRITE_TABLE.lines(record)
