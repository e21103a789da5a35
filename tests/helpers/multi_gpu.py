"""Several GPUs of one host (tests/gpu/test_two_gpus.py): every op's random calls, run on a
device and on the CPU path from the same CPU arguments and compared byte for byte, and the
tensor-parallel worker that the test starts once per GPU.

An ``OpCall`` holds CPU arguments only; ``run`` copies them (same shapes and strides) to the
device it is given each time, so the CPU arguments stay pristine and every run starts from the
same poisoned outputs."""
from __future__ import annotations

import json
import os
import random
import types
from dataclasses import dataclass
from typing import Callable

import torch

import nvrtc_gather as ng
from helpers import cache_gather_reference, mla_reference
from helpers.reference import copy_to, make_gather_case, make_quant_case
from helpers.scatter_cases import make_scatter_case


@dataclass
class OpCall:
    name: str
    fn: Callable
    args: tuple            # CPU tensors and plain values
    outs: tuple[int, ...]  # positions of the arguments the op writes

    def run(self, device, stream: torch.cuda.Stream | None = None) -> list[torch.Tensor]:
        """Run on copies of the arguments on ``device`` (on ``stream`` if given); the written
        arguments' bytes, on the CPU."""
        args = tuple(copy_to(a, device) for a in self.args)
        if stream is None:
            self.fn(*args)
        else:
            with torch.cuda.stream(stream):
                self.fn(*args)
        return [_bytes(args[i]) for i in self.outs]

    def expected(self) -> list[torch.Tensor]:
        return self.run("cpu")


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.uint8).reshape(-1)


def op_calls(seed: int) -> list[OpCall]:
    """A grid of calls of every op: ragged requests, strided views, several block sizes and
    dtypes; different for each seed."""
    rng = random.Random(seed)
    calls = []
    for bs, hd, qbs, batch in ((64, 128, 128, 33), (16, 128, 64, 7), (1, 64, 32, 5)):
        c = make_gather_case(rng, block_size=bs, head_dim=hd, quant_block_size=qbs, batch=batch)
        calls.append(OpCall(f"gather bs={bs} hd={hd} qbs={qbs}", ng.cp_gather_indexer_k_quant_cache, c.args(), (1, 2)))
    for dt, fmt in ((torch.bfloat16, "ue8m0"), (torch.float16, ""), (torch.float32, "ue8m0")):
        c = make_quant_case(rng, head_dim=128, quant_block_size=128, block_size=64, dtype=dt, scale_fmt=fmt,
                            num_tokens=rng.randint(1, 300), extra_rows=3)
        calls.append(OpCall(f"quant {dt} {fmt!r}", ng.indexer_k_quant_and_cache, c.args(), (1,)))
    for _ in range(2):
        c = make_scatter_case(rng)
        calls.append(OpCall(f"scatter {c.desc}", ng.indexer_k_scatter, c.args(), (2,)))
    for fmt, dt in (("fp8_ds_mla", torch.bfloat16), ("fp8_ds_mla", torch.float16), ("auto", torch.bfloat16),
                    ("fp8", torch.bfloat16)):
        c = mla_reference.make_write_case(rng, fmt=fmt, dtype=dt, block_size=rng.choice([16, 64]),
                                          num_tokens=rng.randint(1, 120))
        calls.append(OpCall(f"mla write {fmt} {dt}", ng.concat_and_cache_mla, c.args(), (2,)))
    for bs, seq in ((16, True), (64, False)):
        c = mla_reference.make_gather_case(rng, batch=rng.randint(1, 9), block_size=bs, seq_starts=seq)
        calls.append(OpCall(f"mla gather bs={bs} seq_starts={seq}", ng.cp_gather_and_upconvert_fp8_kv_cache,
                            c.args(), (1,)))
    for conv, bs, seq in (("copy", 16, True), ("copy", 64, False), ("e4m3_bf16", 64, True), ("e5m2_f16", 1, False)):
        lens = cache_gather_reference.ragged(rng, rng.randint(1, 40), rng.choice([3, 40, 200]))
        c = cache_gather_reference.make_case(rng, lens=lens, block_size=bs, conversion=conv, seq_starts=seq,
                                             extra_rows=rng.choice([0, 5]),
                                             src_dtype=torch.bfloat16 if (conv, bs) == ("copy", 64) else torch.uint8)
        if conv == "copy" and bs == 16:
            calls.append(OpCall(f"cp_gather_cache bs={bs} seq_starts={seq}", ng.cp_gather_cache, c.cp_args(), (1,)))
        else:
            calls.append(OpCall(f"gather_and_maybe_dequant_cache {conv} bs={bs} seq_starts={seq}",
                                ng.gather_and_maybe_dequant_cache, c.dequant_args(), (1,)))
    return calls


def mismatches(call: OpCall, device, stream=None) -> list[str]:
    """Empty when the op on ``device`` wrote exactly the CPU path's bytes."""
    got, want = call.run(device, stream), call.expected()
    return [f"{call.name}: argument {i} differs on {device}" for i, g, w in zip(call.outs, got, want)
            if not torch.equal(g, w)]


def gathered_k(seed: int):
    """The indexer gather case whose dst_k the ranks all-gather: other lengths and blocks for
    every seed, the same shape (the lengths are a shuffle of one list)."""
    rng = random.Random(seed)
    lens = [0, 0, 1, 5, 63, 64, 65, 127, 128, 129, 200, 300] * 2
    rng.shuffle(lens)
    return make_gather_case(rng, block_size=64, head_dim=128, quant_block_size=128, batch=len(lens), lens=lens,
                            extra_rows=16, strided=False, k_fp8=False,
                            generator=torch.Generator().manual_seed(seed))


def tp_worker(rank: int, world: int, out_dir: str) -> None:
    """One tensor-parallel rank, as a vLLM worker runs it: the plugin loaded in the process
    (vLLM calls it before the worker has a device), the worker's device set, the init_device hook's
    preload on that GPU only; then every op on this GPU against the CPU path, and an NCCL
    all-gather of each rank's gathered K. Writes ``rank{rank}.json``."""
    import torch.distributed as dist

    from nvrtc_gather.integrations import vllm as ng_vllm, vllm_worker
    from nvrtc_gather.jit import runtime

    report = {"rank": rank, "errors": []}
    ng_vllm.plugin()
    torch.cuda.set_device(rank)
    vllm_worker.preload_worker(types.SimpleNamespace(device=torch.device("cuda", rank),
                                                     model_config=types.SimpleNamespace(dtype=torch.bfloat16)))
    report["preload"] = vllm_worker.status()
    report["loaded_devices"] = sorted({d for (_, d) in runtime._loaded})
    calls = op_calls(1000 + rank)
    for call in calls:
        report["errors"] += mismatches(call, f"cuda:{rank}")
    report["calls"] = len(calls)

    dist.init_process_group("nccl", init_method=f"file://{os.path.join(out_dir, 'rendezvous')}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    try:
        c = gathered_k(rank)
        dev = make_device_case(c, rank)
        ng.cp_gather_indexer_k_quant_cache(*dev)
        mine = dev[1].view(torch.uint8)
        everyone = torch.empty((world * mine.size(0), mine.size(1)), dtype=torch.uint8, device=mine.device)
        dist.all_gather_into_tensor(everyone, mine)
        want = []
        for r in range(world):
            cr = gathered_k(r)
            ng.cp_gather_indexer_k_quant_cache(*cr.args())
            want.append(cr.dst_k.view(torch.uint8))
        report["all_gather_equal"] = torch.equal(everyone.cpu(), torch.cat(want))
        report["all_gather_rows"] = everyone.size(0)
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


def make_device_case(c, device) -> tuple:
    return tuple(copy_to(a, f"cuda:{device}") for a in c.args())
