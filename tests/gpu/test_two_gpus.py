"""Tensor parallelism on one host: one worker process per GPU, started together on one empty
kernel cache, each running every op on its own GPU; and one process driving two GPUs (tensors on
a device other than the current one, fresh threads, side streams, a graph captured on cuda:1).

The worker test runs with one rank per visible GPU, at most two: on one GPU it runs rank 0 alone
(the cache, the worker preload, the ops and a one-rank NCCL all-gather); the parts that need a
second GPU skip with that reason."""
import json
import os
import subprocess
import sys
import threading

import pytest
import torch

from helpers.multi_gpu import mismatches, op_calls, tp_worker
from helpers.reference import copy_to
from nvrtc_gather.jit import cubin_cache

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TWO = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (the nvidia-h200-x2 machine)")


@pytest.mark.parametrize("world", [1, pytest.param(2, marks=TWO)])
def test_tp_workers_start_together_on_one_empty_cache(world, tmp_path, monkeypatch):
    import torch.multiprocessing as mp

    cache = tmp_path / "cache"
    monkeypatch.setenv("NVRTC_GATHER_CACHE_DIR", str(cache))  # the spawned workers inherit it
    mp.start_processes(tp_worker, args=(world, str(tmp_path)), nprocs=world, join=True, start_method="spawn")
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for r, rep in enumerate(reports):
        assert rep["errors"] == [] and rep["calls"] == 18, rep
        assert rep["loaded_devices"] == [r], rep   # the preload touched this rank's GPU only
        assert rep["preload"].startswith(f"loaded on cuda:{r}"), rep
        assert rep["all_gather_equal"], rep
    scan = cubin_cache.DiskCache(cache).scan()
    assert scan.images and all(i.valid for i in scan.images), [(i.path.name, i.problem) for i in scan.images]
    per = [(i.module, i.arch) for i in scan.images]
    assert len(per) == len(set(per)), sorted(per)  # one image per (module, arch), whatever the ranks did
    assert not scan.temps, scan.temps
    verify = subprocess.run([sys.executable, "-m", "nvrtc_gather", "cache", "verify", "--cache-dir", str(cache)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr  # every entry intact, made by this install


@TWO
@pytest.mark.parametrize("current,target", [(0, 1), (1, 0)])
def test_every_op_on_the_device_that_is_not_current(current, target):
    torch.cuda.set_device(current)
    try:
        bad = [m for call in op_calls(7 + target) for m in mismatches(call, f"cuda:{target}")]
        assert torch.cuda.current_device() == current
    finally:
        torch.cuda.set_device(0)
    assert bad == []


@TWO
def test_every_op_on_cuda1_from_a_fresh_thread_and_on_a_side_stream():
    torch.cuda.set_device(0)
    out = {}

    def work():  # a thread that never used CUDA: no context is current in it
        try:
            out["bad"] = [m for call in op_calls(21) for m in mismatches(call, "cuda:1")]
            side = torch.cuda.Stream(device="cuda:1")
            out["bad"] += [m for call in op_calls(22) for m in mismatches(call, "cuda:1", stream=side)]
        except Exception as exc:  # reported below
            out["error"] = repr(exc)
    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert out == {"bad": []}


@TWO
def test_a_graph_captured_on_cuda1_replays_every_op():
    import nvrtc_gather as ng

    torch.cuda.set_device(0)
    ng.preload(1)
    calls = op_calls(33)
    bufs = [tuple(copy_to(a, "cuda:1") for a in c.args) for c in calls]
    with torch.cuda.device(1):
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.graph(g, stream=s):
            for c, args in zip(calls, bufs):
                c.fn(*args)
        for c, args in zip(calls, bufs):  # fresh poisoned outputs, then the replay writes them
            for i in c.outs:
                args[i].copy_(c.args[i])
        g.replay()
        torch.cuda.synchronize(1)
    bad = [c.name for c, args in zip(calls, bufs)
           if any(not torch.equal(args[i].cpu().contiguous().view(torch.uint8).reshape(-1), w)
                  for i, w in zip(c.outs, c.expected()))]
    assert bad == []

