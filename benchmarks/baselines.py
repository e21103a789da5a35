"""The vLLM-style kernels the ops are timed against (baseline_linear_scan.cu, baseline_mla.cu;
never used by the ops): their builds, the parameter structs the .cu files declare again, and a
launch bound once, like an op's remembered layout. Shared by the families that time them."""
from __future__ import annotations

from pathlib import Path

import torch

from nvrtc_gather.jit import runtime
from nvrtc_gather.jit.spec import Entry, KernelModule, ParamStruct
from nvrtc_gather.kernels import gather as gather_kernels

HERE = str(Path(__file__).resolve().parent)
CHUNKED_ENTRIES = ("baseline_cp_gather", "baseline_dequant_auto_bf16", "baseline_dequant_fp8_bf16")

# One block per (request, page) task found by a serial scan: the MLA gather's and the chunked gathers'.
PAGE_TASK_PARAMS = ParamStruct("BaselineCacheGatherParams", (
    ("src_cache", "ptr"), ("dst", "ptr"), ("block_table", "ptr"), ("cu_seq_lens", "ptr"), ("seq_starts", "ptr"),
    ("scale", "ptr"),
    ("block_stride", "i64"), ("entry_stride", "i64"), ("dst_row_stride", "i64"), ("bt_row_stride", "i64"),
    ("num_rows", "i32"), ("batch", "i32"), ("block_size", "i32"), ("max_blocks", "i32"), ("row_bytes", "i32"),
    ("unused", "i32"),
    ("error", "ptr"),
))
MLA_WRITE_PARAMS = ParamStruct("BaselineMlaWriteParams", (
    ("kv_c", "ptr"), ("k_pe", "ptr"), ("slot_mapping", "ptr"), ("kv_cache", "ptr"),
    ("kv_c_row_stride", "i64"), ("k_pe_row_stride", "i64"), ("block_stride", "i64"), ("entry_stride", "i64"),
    ("num_tokens", "i32"), ("block_size", "i32"),
    ("error", "ptr"),
))


def _module(name, source, entries, params, threads=256) -> KernelModule:
    return KernelModule(name=name, source=source, entries=tuple(map(Entry, entries)), params=params,
                        label="baseline", threads=threads, source_dir=HERE)


LINEAR_SCAN = _module("baseline_linear_scan", "baseline_linear_scan.cu", ("baseline_linear_scan",),
                      gather_kernels.PARAMS)
MLA_GATHER = _module("baseline_mla_gather", "baseline_mla.cu", ("baseline_mla_gather",), PAGE_TASK_PARAMS, 512)
MLA_WRITE = _module("baseline_mla_write", "baseline_mla.cu", ("baseline_mla_write",), MLA_WRITE_PARAMS, 96)
CHUNKED = _module("baseline_cache_gather", "baseline_mla.cu", CHUNKED_ENTRIES, PAGE_TASK_PARAMS)
ALL = (LINEAR_SCAN, MLA_GATHER, MLA_WRITE, CHUNKED)


def bound(module: KernelModule, entry: str, grid: int, keep, pointers: tuple = (), **fields):
    """A no-argument launch of ``module``'s ``entry`` on ``grid`` blocks with the struct's
    ``fields`` (``pointers``: its leading data pointers, when not among them), loaded on the
    current device; ``keep`` holds the tensors it points into."""
    dev = torch.cuda.current_device()
    go = runtime.load(module, dev, runtime.current_stream(dev)).launcher(entry, grid, module.params.image(**fields))
    return lambda _keep=keep: go(pointers)


def page_task_grid(num_rows: int, block_size: int, batch: int) -> int:
    """The page-task kernels' grid, as vLLM sizes it: enough blocks for every (request, page)."""
    return -(-num_rows // block_size) + 2 * batch


def page_tasks(p, cu_seq_lens: int, scale: int = 0, row_bytes: int = 0) -> dict:
    """PAGE_TASK_PARAMS' fields from an op's plan ``p`` (the MLA gather's or a chunked gather's):
    ``cu_seq_lens`` is the address of batch + 1 row offsets."""
    return dict(src_cache=p.src_ptr, dst=p.dst_ptr, block_table=p.bt_ptr, cu_seq_lens=cu_seq_lens,
                seq_starts=p.seq_ptr, scale=scale, block_stride=p.block_stride, entry_stride=p.entry_stride,
                dst_row_stride=p.dst_row_stride, bt_row_stride=p.bt_row_stride, num_rows=p.num_rows, batch=p.batch,
                block_size=p.block_size, max_blocks=p.max_blocks, row_bytes=row_bytes, unused=0)
