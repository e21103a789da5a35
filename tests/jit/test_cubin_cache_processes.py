"""The disk cache under concurrency, without a GPU: many processes on an empty cache (with
and without the lock), a writer killed mid-write, a stuck lock holder, many threads.

Children come from a forkserver that has imported nvrtc_gather once, so 16 of them start
in milliseconds instead of importing torch 16 times."""
import fcntl
import json
import multiprocessing as mp
import os
import signal
import threading
import time

import pytest

from nvrtc_gather.jit import build, compiler, cubin_cache, runtime
from nvrtc_gather.kernels import gather as gather_kernels
from nvrtc_gather import kernels

ARCHS = ("sm_80", "sm_90")
N_PROCS = 16


@pytest.fixture(scope="module")
def ctx():
    c = mp.get_context("forkserver")
    c.set_forkserver_preload(["nvrtc_gather.jit.build", "helpers.cache_workers"])
    return c


def _start_all(ctx, target, args_list, timeout=180):
    procs = [ctx.Process(target=target, args=args) for args in args_list]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    return [p.exitcode for p in procs]


def _names(directory):
    return sorted(os.listdir(directory))


def _race(ctx, tmp_path, use_lock, n_procs, archs, modules=kernels.ALL_MODULES):
    """n_procs processes released together on an empty cache, each building ``modules``
    for ``archs``; checks the end state, returns (total compiles, number of entries)."""
    from helpers import cache_workers

    d = tmp_path / "c"
    barrier = ctx.Barrier(n_procs)
    outs = [tmp_path / f"out{i}.json" for i in range(n_procs)]
    codes = _start_all(ctx, cache_workers.build_all, [(str(d), archs, barrier, str(o), use_lock, [m.name for m in modules]) for o in outs])
    assert codes == [0] * n_procs
    results = [json.loads(o.read_text()) for o in outs]
    pairs = {f"{m.name}-{a}" for m in modules for a in archs}
    # every process got the same image for each pair
    for pair in pairs:
        assert len({r["images"][pair] for r in results}) == 1
    # exactly one intact entry per (module, arch), no temp file left
    entries = cubin_cache.DiskCache(d).scan().images
    assert sorted(f"{e.module}-{e.arch}" for e in entries) == sorted(pairs)
    assert all(e.valid for e in entries)
    assert not [n for n in _names(d) if n.endswith(cubin_cache.TMP_SUFFIX)]
    assert set(_names(d)) <= {e.path.name for e in entries} | {e.path.name + cubin_cache.LOCK_SUFFIX for e in entries}
    return sum(r["compiles"] for r in results), len(pairs)


def test_many_processes_on_an_empty_cache_compile_each_entry_once(ctx, tmp_path):
    compiles, pairs = _race(ctx, tmp_path, True, N_PROCS, ARCHS)
    assert compiles == pairs


def test_correctness_does_not_depend_on_the_lock(ctx, tmp_path):
    # without the lock every process may compile: 8 processes x 1 entry keeps that cheap on 2 cores
    compiles, pairs = _race(ctx, tmp_path, False, 8, ARCHS[:1], (gather_kernels.MODULES[16],))
    assert pairs <= compiles <= 8 * pairs


def test_writer_killed_mid_write_leaves_nothing_loadable(ctx, tmp_path):
    from helpers import cache_workers

    d = tmp_path / "c"
    inside = ctx.Event()
    p = ctx.Process(target=cache_workers.stall_in_fsync, args=(str(d), "sm_90", inside))
    p.start()
    try:
        assert inside.wait(120), "the child never reached fsync"
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.join(30)
    assert p.exitcode == -signal.SIGKILL
    target = compiler.Target("sm_90")
    name = build.cache_name(gather_kernels.MODULES[16], target)
    key = build.cache_key(gather_kernels.MODULES[16], target)
    disk = cubin_cache.DiskCache(d)
    temps = disk.scan().temps
    assert len(temps) == 1 and not disk.path_for(name, key).exists()
    assert disk.get(name, key) is None and disk.scan().images == []

    # a later process compiles and publishes; a fresh temp file may be a live writer's: kept
    n = build.stats["compiles"]
    assert not build.build_image(gather_kernels.MODULES[16], target, disk=disk).from_cache
    assert build.stats["compiles"] == n + 1 and [e.valid for e in disk.scan().images] == [True]
    assert disk.scan().temps == temps
    # once old, the next process's first put removes it
    old = time.time() - cubin_cache.STALE_TMP_S - 60
    os.utime(disk.directory / temps[0], (old, old))
    assert cubin_cache.DiskCache(d).put("other", "ab" * 32, b"x")
    assert cubin_cache.DiskCache(d).scan().temps == []


def test_clear_removes_leftover_temp_files(tmp_path):
    disk = cubin_cache.DiskCache(tmp_path / "c")
    assert disk.put("m-sm_90", "ab" * 32, b"x")
    with disk.lock("m-sm_90", "ab" * 32):
        pass
    (disk.directory / f".m-sm_90-{'ab' * 32}.bin.k3j4x_9z.tmp").write_bytes(b"half")
    assert len(disk.clear().removed) == 3 and _names(disk.directory) == []


def test_a_stuck_lock_holder_only_delays(tmp_path, monkeypatch):
    """A lock held forever (a hung process) is given up after LOCK_TIMEOUT_S: we compile anyway."""
    monkeypatch.setattr(cubin_cache, "LOCK_TIMEOUT_S", 0.3)
    disk = cubin_cache.DiskCache(tmp_path / "c")
    target = compiler.Target("sm_90")
    lock_path = str(disk.path_for(build.cache_name(gather_kernels.MODULES[16], target),
                                  build.cache_key(gather_kernels.MODULES[16], target))) + cubin_cache.LOCK_SUFFIX
    disk.usable()
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another open file description: conflicts even in-process
        t0 = time.monotonic()
        built = build.build_image(gather_kernels.MODULES[16], target, disk=disk)
        assert 0.3 <= time.monotonic() - t0 < 30 and not built.from_cache
    finally:
        os.close(fd)
    assert build.build_image(gather_kernels.MODULES[16], target, disk=disk).from_cache


def test_threads_of_one_process_compile_once(tmp_path):
    disk = cubin_cache.DiskCache(tmp_path / "c")
    target = compiler.Target("sm_86")
    n = build.stats["compiles"]
    results = []
    threads = [threading.Thread(target=lambda: results.append(build.build_image(gather_kernels.MODULES[16], target, disk=disk)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and len({r.image for r in results}) == 1
    assert build.stats["compiles"] == n + 1
