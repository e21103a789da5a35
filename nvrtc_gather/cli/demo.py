"""``nvrtc-gather demo``: gather a DeepSeek-V3.2-sized indexer cache, check it, time it.

With a GPU: the NVRTC kernel, checked bit-exact against the torch path, with its
throughput. Without one: says so, runs the CPU (torch) path, checks it against a
per-request loop, and still compiles the kernel for a named arch to show NVRTC works.

Exit status: 0 when every check passed; 1 when one failed or NVRTC refused ``--arch``; 2 for
a bad argument or setting. Without NVRTC, or with NVRTC_GATHER_DISABLE_JIT set, the compile
step says so and is skipped (not a failure): the CPU path needs no NVRTC.

The GPU branch (``run_on_gpu``) reaches torch.cuda only through ``CudaClock``, so the tests
drive it without a GPU too (tests/cli/test_demo.py)."""
from __future__ import annotations

import argparse
import itertools
import random
import sys
import time

import torch

from .._version import __version__
from .. import settings
from ..errors import CompileError, MissingDependencyError
from ..jit import build, compiler, cuda_packages, driver
from ..kernels import gather as gather_kernels
from ..ops.gather import cp_gather_indexer_k_quant_cache, plan_gather
from ..ops.gather_torch import gather_torch
from ..ops.indexer_k_quant import indexer_k_quant_and_cache
from .text import help_text
from .warmup import parse_arch, positive_int, spelled_arch

HEAD_DIM, QBS, BLOCK_SIZE = 128, 128, 64
CACHE_STRIDE = HEAD_DIM + 4 * HEAD_DIM // QBS
# Bounds of the demo's arguments: the setup allocates about 3 * CACHE_STRIDE bytes per token
# (cache, outputs, reference) on the device and the host; 16M tokens is ~6.6 GB.
MAX_BATCH = 1 << 16
MAX_MEAN_LEN = 1 << 20
MAX_TOKENS = 1 << 24


def make_inputs(batch: int, mean_len: int, device: str, seed: int = 0):
    """Random cache bytes, ragged requests (some empty), shuffled physical blocks, and
    upper-bound outputs (8 spare rows) poisoned with 0xA5. Linear in batch and tokens."""
    rng = random.Random(seed)
    lens = [0 if rng.random() < 0.05 else rng.randint(mean_len // 2, mean_len * 3 // 2) for _ in range(batch)]
    blocks = torch.tensor([-(-n // BLOCK_SIZE) for n in lens], dtype=torch.int64)
    num_blocks = int(blocks.sum()) + 64
    g = torch.Generator().manual_seed(seed)
    # random bytes drawn 4 at a time (torch.randint is ~4x slower per uint8 than per int32)
    kv = torch.randint(-2**31, 2**31, (num_blocks, BLOCK_SIZE, CACHE_STRIDE // 4), dtype=torch.int32,
                       generator=g).view(torch.uint8)
    ids = torch.randperm(num_blocks, generator=g).to(torch.int32)
    max_blocks = max(1, int(blocks.max()) if batch else 1)
    # request r takes ids[first[r] : first[r] + blocks[r]]; the rest of its row stays 0
    first = torch.cumsum(blocks, 0) - blocks
    col = torch.arange(max_blocks)
    used = col.unsqueeze(0) < blocks.unsqueeze(1)
    bt = torch.where(used, ids[(first.unsqueeze(1) + col).clamp(max=num_blocks - 1)], torch.zeros((), dtype=torch.int32))
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
    rows = sum(lens) + 8
    dst_k = torch.full((rows, HEAD_DIM), 0xA5, dtype=torch.uint8).view(torch.float8_e4m3fn)
    dst_s = torch.full((rows, 4 * HEAD_DIM // QBS), 0xA5, dtype=torch.uint8)
    return [t.to(device) for t in (kv, dst_k, dst_s, bt, cu)], lens


def loop_gather(kv, dst_k, dst_s, bt, cu, lens):
    """The obvious per-request version, to check the CPU path against."""
    k8 = dst_k.view(torch.uint8)
    for r, n in enumerate(lens):
        for i in range(0, n, BLOCK_SIZE):
            m = min(BLOCK_SIZE, n - i)
            blk = kv[int(bt[r, i // BLOCK_SIZE])].flatten()
            a = int(cu[r]) + i
            k8[a:a + m] = blk[: BLOCK_SIZE * HEAD_DIM].view(BLOCK_SIZE, HEAD_DIM)[:m]
            dst_s[a:a + m] = blk[BLOCK_SIZE * HEAD_DIM: BLOCK_SIZE * CACHE_STRIDE].view(BLOCK_SIZE, -1)[:m]


def full_cycle(device: str, lens=(1500, 0, 2600, 777), scale_fmt="ue8m0", seed=1) -> float:
    """Quantize bf16 K rows into a paged cache, gather them back, dequantize; returns the
    relative error against the input (fp8-e4m3 keeps 3 mantissa bits: a few percent)."""
    g = torch.Generator().manual_seed(seed)
    total = sum(lens)
    k = (torch.randn(total, HEAD_DIM, generator=g) * torch.rand(total, 1, generator=g) * 4).to(torch.bfloat16)
    blocks = [-(-n // BLOCK_SIZE) for n in lens]
    num_blocks = sum(blocks) + 16
    kv = torch.randint(0, 256, (num_blocks, BLOCK_SIZE, CACHE_STRIDE), dtype=torch.uint8, generator=g)
    ids = torch.randperm(num_blocks, generator=g)
    bt = torch.zeros(len(lens), max(blocks), dtype=torch.int32)
    slots, used = [], 0
    for r, (n, nb) in enumerate(zip(lens, blocks)):
        bt[r, :nb] = ids[used:used + nb]
        used += nb
        slots += [int(bt[r, i // BLOCK_SIZE]) * BLOCK_SIZE + i % BLOCK_SIZE for i in range(n)]
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
    slot_mapping = torch.tensor(slots, dtype=torch.int64)
    k, kv, bt, cu, slot_mapping = (t.to(device) for t in (k, kv, bt, cu, slot_mapping))
    indexer_k_quant_and_cache(k, kv, slot_mapping, QBS, scale_fmt)
    dst_k = torch.empty(total, HEAD_DIM, dtype=torch.float8_e4m3fn, device=device)
    dst_s = torch.empty(total, HEAD_DIM // QBS, dtype=torch.float32, device=device)
    cp_gather_indexer_k_quant_cache(kv, dst_k, dst_s, bt, cu)
    deq = dst_k.float().view(total, -1, QBS) * dst_s.view(total, -1, 1)
    ref = k.float().view(total, -1, QBS)
    return float((deq - ref).norm() / ref.norm())


def _gbps(tokens: int, seconds: float) -> float:
    return 2 * tokens * CACHE_STRIDE / seconds / 1e9  # bytes read + written


class CudaClock:
    """What the GPU branch needs of torch.cuda; the CPU tests substitute a stand-in."""

    def device_name(self, device: torch.device) -> str:
        return torch.cuda.get_device_name(device)

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def seconds_per_call(self, fn, calls: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls / 1e3


def gpu_available() -> bool:
    return torch.cuda.is_available()


def run_on_gpu(tensors, tokens: int, nvrtc: str | None, clock: CudaClock) -> bool:
    """The NVRTC kernel on the demo's tensors: first-call cost, bit-exactness against the torch
    path, throughput. Returns whether it was bit-exact."""
    kv, dst_k, dst_s, bt, cu = tensors
    print(f"GPU: {clock.device_name(kv.device)} (sm_{driver.capability(kv.device.index or 0)}); NVRTC {nvrtc}")
    t0 = time.perf_counter()
    cp_gather_indexer_k_quant_cache(kv, dst_k, dst_s, bt, cu)
    clock.synchronize()
    print(f"first call (compile or disk cache, load, run): {(time.perf_counter() - t0) * 1e3:.1f} ms "
          f"[{build.stats['compiles']} compiled, {build.stats['disk_hits']} from disk cache]")
    ref_k, ref_s = dst_k.clone(), dst_s.clone()
    ref_k.view(torch.uint8).fill_(0xA5)
    ref_s.fill_(0xA5)
    gather_torch(plan_gather(kv, ref_k, ref_s, bt, cu), kv, ref_k, ref_s, bt, cu)
    same = torch.equal(dst_k.view(torch.uint8), ref_k.view(torch.uint8)) and torch.equal(dst_s, ref_s)
    print(f"bit-exact against the torch path: {'yes' if same else 'NO'}")
    sec = clock.seconds_per_call(lambda: cp_gather_indexer_k_quant_cache(kv, dst_k, dst_s, bt, cu), 20)
    print(f"NVRTC kernel: {sec * 1e6:.1f} us per call, {_gbps(tokens, sec):.0f} GB/s (read + write, L2 warm)")
    return same


def run_on_cpu(tensors, lens) -> bool:
    """The CPU (torch) path, checked against a per-request loop. Returns whether they agree."""
    kv, dst_k, dst_s, bt, cu = tensors
    print("GPU: none visible to torch, so the CUDA kernel cannot run here; running the CPU (torch) path")
    t0 = time.perf_counter()
    cp_gather_indexer_k_quant_cache(kv, dst_k, dst_s, bt, cu)
    sec = time.perf_counter() - t0
    ref_k, ref_s = dst_k.clone(), dst_s.clone()
    ref_k.view(torch.uint8).fill_(0xA5)
    ref_s.fill_(0xA5)
    loop_gather(kv, ref_k, ref_s, bt, cu, lens)
    same = torch.equal(dst_k.view(torch.uint8), ref_k.view(torch.uint8)) and torch.equal(dst_s, ref_s)
    print(f"CPU path: {sec * 1e3:.1f} ms, {_gbps(sum(lens), sec):.1f} GB/s; "
          f"matches a per-request loop: {'yes' if same else 'NO'}")
    return same


def compile_step(arch: str, nvrtc: str | None, no_jit: bool) -> bool:
    """Without a GPU: compile the gather kernel for ``arch`` to show NVRTC works. Says why
    when it cannot (NVRTC missing, NVRTC_GATHER_DISABLE_JIT set: both not failures) and returns
    False only when NVRTC refused the arch (a message, never a traceback)."""
    if nvrtc is None:
        print(f"compile step skipped: NVRTC is missing; the CPU path below needs none. To compile "
              f"kernels, {cuda_packages.install_hint()}")
        return True
    if no_jit:
        print(f"compile step skipped: {settings.DISABLE_JIT_ENV} is set, so nothing is compiled in this process")
        return True
    try:
        target = parse_arch(arch)
        t0 = time.perf_counter()
        code = compiler.compile_module(gather_kernels.MODULES[16], target)
    except (ValueError, CompileError) as exc:
        print(f"error: NVRTC {nvrtc} could not compile for --arch {arch}: {exc}", file=sys.stderr)
        return False
    print(f"NVRTC {nvrtc}: compiled the gather kernel for {target.arch} without a GPU "
          f"({len(code.image)} bytes of cubin in {(time.perf_counter() - t0) * 1e3:.0f} ms)")
    return True


def _bounded(most: int):
    """argparse type: an int in [1, most]."""
    def parse(text: str) -> int:
        n = positive_int(text)
        if n > most:
            raise argparse.ArgumentTypeError(f"must be at most {most}, got {n}")
        return n
    return parse


def main(argv=None, clock: CudaClock | None = None, device: str | None = None) -> int:
    """``clock`` and ``device`` let tests run the GPU branch's code on CPU tensors."""
    ap = argparse.ArgumentParser(prog="nvrtc-gather demo", description=help_text(__doc__, first_line_only=True))
    ap.add_argument("--batch", type=_bounded(MAX_BATCH), default=64, help=f"requests (default 64, at most {MAX_BATCH})")
    ap.add_argument("--mean-len", type=_bounded(MAX_MEAN_LEN), default=2048,
                    help=f"mean tokens per request (default 2048, at most {MAX_MEAN_LEN})")
    ap.add_argument("--arch", default="sm_90", help="arch to compile for when no GPU is present (default sm_90)")
    args = ap.parse_args(argv)
    most_tokens = args.batch * (args.mean_len * 3 // 2)  # lengths are drawn up to 1.5x the mean
    if most_tokens > MAX_TOKENS:
        ap.error(f"--batch {args.batch} x --mean-len {args.mean_len} allows up to {most_tokens} tokens; the demo "
                 f"takes at most {MAX_TOKENS} (about {3 * CACHE_STRIDE * MAX_TOKENS / 1e9:.1f} GB of buffers)")
    try:
        spelled_arch(args.arch)  # a misspelt --arch is an argument error, with or without NVRTC
    except ValueError as exc:
        ap.error(f"--arch: {exc}")
    no_jit = settings.jit_disabled()  # a bad value raises InvalidSettingError: the CLI names the variable
    print(f"nvrtc_gather {__version__}, torch {torch.__version__}")

    try:
        nvrtc = "%d.%d" % compiler.nvrtc_version()
    except MissingDependencyError as exc:
        print(f"NVRTC: not available ({exc})")
        nvrtc = None
    gpu = clock is not None or gpu_available()
    compiled = True
    if not gpu:
        compiled = compile_step(args.arch, nvrtc, no_jit)

    device = device or ("cuda" if gpu else "cpu")
    tensors, lens = make_inputs(args.batch, args.mean_len, device)
    kv, dst_k = tensors[0], tensors[1]
    tokens = sum(lens)
    print(f"cache: {kv.shape[0]} blocks x {BLOCK_SIZE} tokens x {CACHE_STRIDE} bytes "
          f"({kv.numel() / 2**20:.0f} MiB); {args.batch} requests, {tokens} tokens "
          f"({lens.count(0)} empty), blocks shuffled")
    same = run_on_gpu(tensors, tokens, nvrtc, clock or CudaClock()) if gpu else run_on_cpu(tensors, lens)
    untouched = bool((dst_k.view(torch.uint8)[tokens:] == 0xA5).all())
    print(f"spare rows past cu_seq_lens[-1] left untouched: {'yes' if untouched else 'NO'}")
    err = full_cycle(device)
    cycle_ok = err < 0.05
    print(f"full cycle on {device} (bf16 K -> indexer_k_quant_and_cache -> gather -> dequantize): relative error "
          f"{err:.4f} against the input ({'within' if cycle_ok else 'OUTSIDE'} fp8-e4m3 tolerance, 0.05)")
    return 0 if same and untouched and cycle_ok and compiled else 1


if __name__ == "__main__":
    raise SystemExit(main())
