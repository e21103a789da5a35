"""Native-to-torch behaviour on a GPU: CUDA graphs, streams, threads, several GPUs,
torch.compile with inductor, opcheck."""
import itertools
import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch

import nvrtc_gather as ng
from helpers.reference import SENTINEL, gather_reference, make_gather_case, to_device

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout


def _fixed_shape_contents(rng, batch, max_blocks, num_blocks, block_size, rows, cs=132):
    """Random contents for buffers of fixed shapes: lengths (sum <= rows), block table, cache."""
    while True:
        lens = [rng.randint(0, max_blocks * block_size) for _ in range(batch)]
        if sum(lens) <= rows and sum(-(-n // block_size) for n in lens) <= num_blocks:
            break
    ids = list(range(num_blocks))
    rng.shuffle(ids)
    bt = torch.randint(0, num_blocks, (batch, max_blocks), dtype=torch.int32)
    it = iter(ids)
    for r, n in enumerate(lens):
        for j in range(-(-n // block_size)):
            bt[r, j] = next(it)
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)
    kv = torch.randint(0, 256, (num_blocks, block_size, cs), dtype=torch.uint8)
    return kv, bt, cu


def test_cuda_graph_replay_follows_new_contents():
    rng = random.Random(0)
    batch, max_blocks, num_blocks, bs, rows = 12, 6, 80, 16, 1200
    kv_h, bt_h, cu_h = _fixed_shape_contents(rng, batch, max_blocks, num_blocks, bs, rows)
    kv, bt, cu = kv_h.cuda(), bt_h.cuda(), cu_h.cuda()
    dst_k = torch.empty(rows, 128, dtype=torch.float8_e4m3fn, device="cuda")
    dst_s = torch.empty(rows, 4, dtype=torch.uint8, device="cuda")
    ng.cp_gather_indexer_k_quant_cache(kv, dst_k, dst_s, bt, cu)  # warm-up: compile and load outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ng.cp_gather_indexer_k_quant_cache(kv, dst_k, dst_s, bt, cu)
    for _ in range(3):
        kv_h, bt_h, cu_h = _fixed_shape_contents(rng, batch, max_blocks, num_blocks, bs, rows)
        kv.copy_(kv_h)
        bt.copy_(bt_h)
        cu.copy_(cu_h)
        dst_k.view(torch.uint8).fill_(SENTINEL)
        dst_s.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()
        k_ref, s_ref = gather_reference(kv_h, bt_h, cu_h, rows, 128, 1)
        assert torch.equal(dst_k.view(torch.uint8).cpu(), k_ref)
        assert torch.equal(dst_s.cpu(), s_ref)


_CAPTURE_FIRST = textwrap.dedent("""
    import sys, torch, nvrtc_gather as ng
    preload = sys.argv[1] == "preload"
    kv = torch.randint(0, 256, (8, 16, 132), dtype=torch.uint8, device="cuda")
    k = torch.empty(64, 128, dtype=torch.uint8, device="cuda"); s = torch.empty(64, 4, dtype=torch.uint8, device="cuda")
    bt = torch.arange(8, dtype=torch.int32, device="cuda").view(2, 4); cu = torch.tensor([0, 30, 60], dtype=torch.int32, device="cuda")
    if preload:
        ng.preload(0)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            ng.cp_gather_indexer_k_quant_cache(kv, k, s, bt, cu)
        outcome = "captured"
    except ng.CaptureError as exc:
        outcome = "CaptureError: " + str(exc)
    # Whatever happened, the process can still capture and replay afterwards.
    ng.preload(0)
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2):
        ng.cp_gather_indexer_k_quant_cache(kv, k, s, bt, cu)
    k.zero_(); g2.replay(); torch.cuda.synchronize()
    ref = kv.cpu().flatten(1)[:, :16 * 128].reshape(8, 16, 128)  # fp8 values are token-major in a block
    exp = torch.cat([ref[0], ref[1, :14]])
    print(outcome)
    print("replay-ok" if torch.equal(k[:30].cpu(), exp) else "replay-wrong")
""")


@pytest.mark.parametrize("mode", ["cold", "preload"])
def test_first_call_inside_capture(mode, tmp_path):
    env = dict(os.environ, NVRTC_GATHER_CACHE_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", _CAPTURE_FIRST, mode], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    if mode == "preload":
        assert lines[0] == "captured"
    else:
        assert lines[0].startswith("CaptureError") and "preload" in lines[0]
    assert lines[-1] == "replay-ok"


def test_side_stream_ordering_with_events():
    rng = random.Random(3)
    c_cpu = make_gather_case(rng, block_size=64, head_dim=128, quant_block_size=128, batch=30, strided=False,
                             max_len=2000)
    c = to_device(c_cpu, "cuda")
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    new_kv = torch.randint(0, 256, c.kv_cache.shape, dtype=torch.uint8)
    staged = new_kv.cuda()
    ready, done = torch.cuda.Event(), torch.cuda.Event()
    ng.cp_gather_indexer_k_quant_cache(*c.args())  # warm-up
    torch.cuda.synchronize()
    with torch.cuda.stream(producer):
        torch.cuda._sleep(20_000_000)  # keep the producer busy so a missing wait would show
        c.kv_cache.copy_(staged)
        ready.record()
    with torch.cuda.stream(consumer):
        consumer.wait_event(ready)
        ng.cp_gather_indexer_k_quant_cache(*c.args())
        done.record()
    done.synchronize()
    k_ref, s_ref = gather_reference(new_kv, c_cpu.block_table, c_cpu.cu_seq_lens, c_cpu.dst_k.size(0), 128, 1)
    assert torch.equal(c.dst_k.view(torch.uint8).cpu(), k_ref)
    assert torch.equal(c.dst_scale.view(torch.uint8).cpu(), s_ref)


_THREADS = textwrap.dedent("""
    import random, sys, threading, torch
    sys.path.insert(0, "tests")
    import nvrtc_gather as ng
    from nvrtc_gather.jit import build, runtime
    from helpers.reference import make_gather_case, to_device, gather_reference
    cases = [make_gather_case(random.Random(i), block_size=16, head_dim=128, quant_block_size=64, batch=9, strided=False)
             for i in range(8)]
    gpu = [to_device(c, "cuda") for c in cases]
    torch.cuda.synchronize()
    start = threading.Barrier(8)
    errors = []
    def work(i):
        try:
            start.wait()
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                ng.cp_gather_indexer_k_quant_cache(*gpu[i].args())
            s.synchronize()
        except Exception as exc:
            errors.append(repr(exc))
    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    [t.start() for t in ts]; [t.join() for t in ts]
    bad = 0
    for c, g in zip(cases, gpu):
        k, s = gather_reference(c.kv_cache, c.block_table, c.cu_seq_lens, c.dst_k.size(0), 128, 2)
        bad += not (torch.equal(g.dst_k.view(torch.uint8).cpu(), k) and torch.equal(g.dst_scale.view(torch.uint8).cpu(), s))
    print(build.stats["compiles"], bad, errors)
""")


def test_eight_threads_on_a_cold_process_compile_once(tmp_path):
    env = dict(os.environ, NVRTC_GATHER_CACHE_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", _THREADS], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    compiles, bad, errors = r.stdout.strip().split(" ", 2)
    assert (compiles, bad, errors) == ("1", "0", "[]")


def test_a_thread_where_no_context_is_current_still_launches(monkeypatch):
    """The launcher launches as if the device's primary context were current and asks only when
    the driver refuses: in a thread where no CUDA context is current, the first try is refused
    and the retry, with the primary context pushed, runs the kernel."""
    import ctypes
    import threading

    from nvrtc_gather.jit import driver

    c_cpu = make_gather_case(random.Random(8), block_size=16, head_dim=128, quant_block_size=64, batch=6,
                             strided=False)
    c = to_device(c_cpu, "cuda")
    ng.cp_gather_indexer_k_quant_cache(*c.args())  # the layout and its launcher, made on this thread
    torch.cuda.synchronize()
    c.dst_k.view(torch.uint8).fill_(SENTINEL)
    raw = driver.raw()
    real_launch, codes, seen = raw.launch_ex, [], {}
    monkeypatch.setattr(raw, "launch_ex", lambda *a: codes.append(real_launch(*a)) or codes[-1])

    def work():
        try:
            cur = ctypes.c_void_p()
            raw.ctx_get_current(ctypes.byref(cur))
            seen["current"] = cur.value
            ng.cp_gather_indexer_k_quant_cache(*c.args())
        except Exception as exc:  # reported below
            seen["error"] = repr(exc)
    t = threading.Thread(target=work)
    t.start()
    t.join()
    torch.cuda.synchronize()
    assert seen.get("current") is None and "error" not in seen, seen
    assert len(codes) == 2 and codes[0] != 0 and codes[1] == 0, codes  # refused, then run
    k, _ = gather_reference(c_cpu.kv_cache, c_cpu.block_table, c_cpu.cu_seq_lens, c_cpu.dst_k.size(0), 128, 2)
    assert torch.equal(c.dst_k.view(torch.uint8).cpu(), k)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (run on the nvidia-h200-x2 machine)")
def test_tensors_on_another_device_than_the_current_one():
    rng = random.Random(4)
    c_cpu = make_gather_case(rng, block_size=64, head_dim=128, quant_block_size=128, batch=20, strided=True)
    torch.cuda.set_device(0)
    c1 = to_device(c_cpu, "cuda:1")
    ng.cp_gather_indexer_k_quant_cache(*c1.args())
    torch.cuda.synchronize(1)
    assert torch.cuda.current_device() == 0
    k, s = gather_reference(c_cpu.kv_cache, c_cpu.block_table, c_cpu.cu_seq_lens, c_cpu.dst_k.size(0), 128, 1)
    assert torch.equal(c1.dst_k.view(torch.uint8).cpu(), k) and torch.equal(c1.dst_scale.view(torch.uint8).cpu(), s)
    c0 = to_device(c_cpu, "cuda:0")  # and device 0 still works after device 1 was used
    ng.cp_gather_indexer_k_quant_cache(*c0.args())
    assert torch.equal(c0.dst_k.view(torch.uint8).cpu(), k)
    with pytest.raises(ValueError, match="same device"):
        ng.cp_gather_indexer_k_quant_cache(c1.kv_cache, c0.dst_k, c0.dst_scale, c0.block_table, c0.cu_seq_lens)


def test_torch_compile_with_inductor_and_opcheck_on_gpu():
    torch._dynamo.reset()
    c_cpu = make_gather_case(random.Random(6), block_size=16, head_dim=128, quant_block_size=64, batch=7,
                             strided=False)
    c = to_device(c_cpu, "cuda")

    def step(kv, dst_k, dst_s, bt, cu):
        ng.cp_gather_indexer_k_quant_cache(kv, dst_k, dst_s, bt, cu)
        return dst_k.view(torch.uint8).to(torch.int64).sum()  # exact, whatever the order of the sum

    out = torch.compile(step, fullgraph=True)(*c.args())
    k, s = gather_reference(c_cpu.kv_cache, c_cpu.block_table, c_cpu.cu_seq_lens, c_cpu.dst_k.size(0), 128, 2)
    assert torch.equal(c.dst_k.view(torch.uint8).cpu(), k)
    assert int(out) == int(k.to(torch.int64).sum())
    torch.library.opcheck(torch.ops.nvrtc_gather.cp_gather_indexer_k_quant_cache.default, to_device(c_cpu, "cuda").args())
